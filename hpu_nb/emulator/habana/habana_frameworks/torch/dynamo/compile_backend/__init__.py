"""habana_frameworks.torch.dynamo.compile_backend, emulated: the package that registers torch.compile's "hpu_backend".

As Habana's, importing it registers the backend and, when PT_HPU_ENABLE_COMPILED_AUTOGRAD is true (default false),
turns on compiled autograd with hpu_backend (`experimental.enable_compiled_autograd()`).
"""

from __future__ import annotations

import os

from hpu_nb.emulator.graph_compiler import register
from hpu_nb.runtime.env import is_true

__emulated__ = True
COMPILED_AUTOGRAD_ENV = "PT_HPU_ENABLE_COMPILED_AUTOGRAD"

register()

if is_true(os.environ.get(COMPILED_AUTOGRAD_ENV)):
    from habana_frameworks.torch.dynamo.compile_backend.experimental import enable_compiled_autograd

    enable_compiled_autograd()

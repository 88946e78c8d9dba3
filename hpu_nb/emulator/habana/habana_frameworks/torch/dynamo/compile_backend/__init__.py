"""habana_frameworks.torch.dynamo.compile_backend, emulated: the package that registers torch.compile's "hpu_backend".

As Habana's, importing it registers the backend and, when PT_HPU_ENABLE_COMPILED_AUTOGRAD is true (default false),
turns on compiled autograd with hpu_backend (`experimental.enable_compiled_autograd()`).
"""

from __future__ import annotations

import os

from hpu_nb.runtime.compile_backend import register

__emulated__ = True
COMPILED_AUTOGRAD_ENV = "PT_HPU_ENABLE_COMPILED_AUTOGRAD"

register()

if os.environ.get(COMPILED_AUTOGRAD_ENV, "").strip().lower() in ("1", "y", "yes", "t", "true", "on"):
    from habana_frameworks.torch.dynamo.compile_backend.experimental import enable_compiled_autograd

    enable_compiled_autograd()

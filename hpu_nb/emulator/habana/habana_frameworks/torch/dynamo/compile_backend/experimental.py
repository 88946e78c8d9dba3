"""habana_frameworks.torch.dynamo.compile_backend.experimental, emulated: compiled autograd with hpu_backend.

`enable_compiled_autograd(**kwargs)` does what Habana's does (gaudi-pytorch-bridge 1.19): from then on, in this
process, every backward pass is captured by torch's compiled autograd and compiled with
`torch.compile(graph, backend="hpu_backend", options={"inference": False}, **kwargs)`; it resets dynamo (before
setting the compiler: torch's reset now drops it, so Habana's 1.19 order would undo itself), sets
`torch._dynamo.config.optimize_ddp = "python_reducer"` and the autograd fallback mode to "nothing", and warns. Call
it before any torch.compile. On the emulated Gaudi the backward graphs run through the emulated hpu_backend (counted
in its compile metrics like forward graphs) with the device's CPU kernels: the same gradients, no speed-up.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch

__emulated__ = True
logger = logging.getLogger("habana_frameworks.torch.dynamo.compile_backend")  # Habana logs as "PT_COMPILE"


def enable_compiled_autograd(**kwargs: Any) -> None:
    """Enable compiled autograd for hpu_backend; `kwargs` go to the torch.compile of each backward graph."""
    from torch._dynamo import compiled_autograd  # noqa: PLC0415 -- lazy: dynamo takes seconds to import

    logger.warning("Enabling CompiledAutograd for hpu_backend with torch.compile")

    def compiler_fn(gm: Any) -> Any:
        return torch.compile(gm, backend="hpu_backend", options={"inference": False}, **kwargs)

    torch._dynamo.reset()  # first: on torch >= 2.5 a reset also drops the autograd compiler (Habana's 1.19 reset after)
    compiler = functools.partial(compiled_autograd.AutogradCompilerInstance, compiler_fn)
    set_compiler = torch._C._dynamo.compiled_autograd.set_autograd_compiler
    try:
        set_compiler(compiler, True)  # torch >= 2.6: (compiler, dynamic), dynamic as torch's own default
    except TypeError:
        set_compiler(compiler)  # the one-argument form of older torch
    compiled_autograd.compiled_autograd_enabled = True  # what torch's own enabling sets beside the compiler
    torch._dynamo.config.optimize_ddp = "python_reducer"
    torch._C._set_autograd_fallback_mode("nothing")

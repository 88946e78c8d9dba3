"""The emulated Gaudi's graph compiler: what torch.compile(backend="hpu_backend") runs without Habana's software.

On a Gaudi, Habana's graph compiler builds recipes from the graphs TorchDynamo captures, and
`metric_global("graph_compilation")` / `("recipe_cache")` count what it did; `enable_dynamic_shape()` lets one recipe
serve many shapes. The emulated Gaudi does the same capture and split (AOTAutograd, torch's "aot_eager") and runs the
graphs with the device's CPU kernels, counting the same things for the same purpose: each graph dynamo hands it is a
compilation (a recompilation when dynamo compiled that frame before), each later call of a compiled graph a
recipe-cache hit. Measured with torch 2.13: "aot_eager" works on `hpu` tensors; "inductor" does not (no code generator
for the `hpu` device), so the emulation runs the same code, not faster. Memory stays exact: compiled graphs allocate
through the device's counting allocator like eager ops do.

The dynamic-shape switch (PT_HPU_ENABLE_REFINE_DYNAMIC_SHAPES, default off as on a Gaudi) becomes torch.compile's
automatic dynamic shapes once the emulated backend is used: off, every new shape is a recompilation.

How torch finds "hpu_backend" (the entry point, and handing over to Habana's where it is installed) is the runtime's
job: hpu_nb.runtime.compile_backend.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from hpu_nb.runtime.compile_backend import BACKEND_NAME, habanas_for_torch, no_habana_backend
from hpu_nb.runtime.env import DYNAMIC_SHAPES_ENV, is_true
from hpu_nb.runtime.habana_install import EMULATED_MARK, real_habana_spec


class CompileCounters:
    """What the emulated graph compiler did in this process."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.compilations = 0
        self.recompilations = 0  # compilations of a frame compiled before (a guard failed: a new shape, ...)
        self.compile_time_us = 0
        self.cache_hits = 0  # calls of an already compiled graph
        self.cache_misses = 0  # = compilations


COUNTERS = CompileCounters()
_lock = threading.Lock()
_dynamic_shapes: bool | None = None  # None: not set in this process yet (the environment's value applies)
_applied = False


# -- dynamic shapes -------------------------------------------------------------------------------------------------
def dynamic_shapes_enabled() -> bool:
    """Habana's switch: PT_HPU_ENABLE_REFINE_DYNAMIC_SHAPES (off by default), or enable/disable_dynamic_shape()."""
    if _dynamic_shapes is not None:
        return _dynamic_shapes
    return is_true(os.environ.get(DYNAMIC_SHAPES_ENV))


def set_dynamic_shapes(enabled: bool) -> None:
    global _dynamic_shapes
    _dynamic_shapes = bool(enabled)
    if _applied:
        _apply_dynamic_shapes()


def _apply_dynamic_shapes() -> None:
    import torch._dynamo  # noqa: PLC0415 -- lazy: seconds to import (here loaded by a compile)

    torch._dynamo.config.automatic_dynamic_shapes = dynamic_shapes_enabled()


# -- the backend ----------------------------------------------------------------------------------------------------
def emulated_hpu_backend(graph_module: Any, example_inputs: list[Any], **kwargs: Any) -> Callable[..., Any]:
    """Compile a captured graph for the emulated Gaudi: AOTAutograd, graphs run with the hpu device's kernels."""
    if real_habana_spec() is not None:
        return _habanas(graph_module, example_inputs, **kwargs)
    global _applied
    import torch  # noqa: PLC0415 -- lazy: keeps this module cheap to import

    from hpu_nb.emulator import hpu_device  # noqa: PLC0415 -- lazy: the emulated device imports torch

    hpu_device.load()
    start = time.perf_counter()
    if not _applied:
        _applied = True
        _apply_dynamic_shapes()  # the emulated Gaudi is in use: Gaudi's dynamic-shape rule from now on
    compile_id = torch._guards.CompileContext.current_compile_id()
    recompiled = (getattr(compile_id, "frame_compile_id", 0) or 0) > 0  # dynamo's count of this frame's compilations
    compiled = torch._dynamo.lookup_backend("aot_eager")(graph_module, example_inputs)
    with _lock:
        COUNTERS.compilations += 1
        COUNTERS.cache_misses += 1
        COUNTERS.recompilations += int(recompiled)
        COUNTERS.compile_time_us += int((time.perf_counter() - start) * 1e6)
    first_call = [True]

    def run(*args: Any) -> Any:
        if first_call[0]:
            first_call[0] = False  # the run that follows a compilation is its cache miss, already counted
        else:
            with _lock:
                COUNTERS.cache_hits += 1
        return compiled(*args)

    return run


# Marked as the emulated surface's modules are, so the runtime can tell it from Habana's in torch's registry.
setattr(emulated_hpu_backend, EMULATED_MARK, True)


def stats() -> dict[str, dict[str, Any]]:
    """The counters in Habana's metric shapes: {"graph_compilation": {...}, "recipe_cache": {...}}."""
    with _lock:
        number, total = COUNTERS.compilations, COUNTERS.compile_time_us
        return {
            "graph_compilation": {"TotalNumber": number, "TotalTime": total, "AvgTime": total / number if number else 0,
                                  "Recompilations": COUNTERS.recompilations},
            "recipe_cache": {"TotalHit": COUNTERS.cache_hits, "TotalMiss": COUNTERS.cache_misses},
        }


def register() -> None:
    """Register the emulated backend now (what importing the emulated `habana_frameworks.torch.dynamo` does)."""
    from torch._dynamo.backends.registry import (  # noqa: PLC0415 -- lazy: torch._dynamo takes seconds to import
        _COMPILER_FNS,
        register_backend,
    )

    if BACKEND_NAME not in _COMPILER_FNS:
        register_backend(emulated_hpu_backend, name=BACKEND_NAME)


def _habanas(graph_module: Any, example_inputs: list[Any], **kwargs: Any) -> Callable[..., Any]:
    """The emulated backend was registered before Habana's software was found (a process that started emulated):
    hand the graph to Habana's backend, registered in its place (the runtime finds it)."""
    habana = habanas_for_torch()
    if habana is no_habana_backend:
        from torch._dynamo.backends.registry import _COMPILER_FNS  # noqa: PLC0415 -- lazy: seconds to import

        _COMPILER_FNS[BACKEND_NAME] = emulated_hpu_backend
    result: Callable[..., Any] = habana(graph_module, example_inputs, **kwargs)
    return result

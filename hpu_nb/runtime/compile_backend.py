"""The emulated Gaudi's graph compiler: `torch.compile(model, backend="hpu_backend")`, its metrics and dynamic shapes.

On a Gaudi, Habana's `hpu_backend` compiles each captured graph into a recipe, and `metric_global("graph_compilation")`
/ `("recipe_cache")` count what it did; `enable_dynamic_shape()` lets one recipe serve many shapes. The emulated Gaudi
has no graph compiler: its `hpu_backend` runs dynamo's graphs eagerly on the hpu device, and counts the same things for
the same purpose - each graph dynamo hands it is a compilation (TotalTime in microseconds, as Habana reports it), each
compilation of a frame compiled before is a recompilation, each call of an already compiled graph a recipe-cache hit.
The dynamic-shape switch (PT_HPU_ENABLE_REFINE_DYNAMIC_SHAPES, default off as on a Gaudi) becomes torch.compile's
automatic dynamic shapes once the emulated `hpu_backend` is used: off, every new shape is a recompilation.

`install()` registers "hpu_backend" with dynamo when `torch._dynamo` is imported (never importing it itself: it is
heavy; hpu_nb/_import_hooks.py), and only where Habana's software is not installed (it registers its own).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable

BACKEND_NAME = "hpu_backend"
DYNAMIC_SHAPES_ENV = "PT_HPU_ENABLE_REFINE_DYNAMIC_SHAPES"
_TRUE = ("1", "y", "yes", "t", "true", "on")


class CompileCounters:
    """What the emulated graph compiler did in this process (a plain class: this module loads on `import torch`)."""

    def __init__(self) -> None:
        self.compilations = 0
        self.recompilations = 0  # compilations of a frame compiled before (a guard failed: a new shape, ...)
        self.compile_time_us = 0
        self.cache_hits = 0  # calls of an already compiled graph
        self.cache_misses = 0  # = compilations

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]


COUNTERS = CompileCounters()
_lock = threading.Lock()
_dynamic_shapes: bool | None = None  # None: not set in this process yet (the environment's value applies)
_applied = False


# -- dynamic shapes -------------------------------------------------------------------------------------------------
def dynamic_shapes_enabled() -> bool:
    """Habana's switch: PT_HPU_ENABLE_REFINE_DYNAMIC_SHAPES (off by default), or enable/disable_dynamic_shape()."""
    if _dynamic_shapes is not None:
        return _dynamic_shapes
    return os.environ.get(DYNAMIC_SHAPES_ENV, "").strip().lower() in _TRUE


def set_dynamic_shapes(enabled: bool) -> None:
    global _dynamic_shapes
    _dynamic_shapes = bool(enabled)
    if _applied:
        _apply_dynamic_shapes()


def _apply_dynamic_shapes() -> None:
    import torch._dynamo

    torch._dynamo.config.automatic_dynamic_shapes = dynamic_shapes_enabled()


# -- the backend ----------------------------------------------------------------------------------------------------
def hpu_backend(graph_module: Any, example_inputs: Any, **kwargs: Any) -> Callable[..., Any]:
    """dynamo backend "hpu_backend" on the emulated Gaudi: no recipe is compiled; the graph runs eagerly on `hpu`."""
    global _applied
    start = time.perf_counter()
    import torch

    if not _applied:
        _applied = True
        _apply_dynamic_shapes()  # the emulated Gaudi is in use: Gaudi's dynamic-shape rule from now on
    compile_id = torch._guards.CompileContext.current_compile_id()
    recompiled = (getattr(compile_id, "frame_compile_id", 0) or 0) > 0  # dynamo's count of this frame's compilations
    with _lock:
        COUNTERS.compilations += 1
        COUNTERS.cache_misses += 1
        COUNTERS.recompilations += int(recompiled)
    forward = graph_module.forward
    first_call = [True]

    def run(*args: Any) -> Any:
        if first_call[0]:
            first_call[0] = False  # the run that follows a compilation is its cache miss, already counted
        else:
            COUNTERS.cache_hits += 1
        return forward(*args)

    with _lock:
        COUNTERS.compile_time_us += int((time.perf_counter() - start) * 1e6)
    return run


def stats() -> dict[str, dict[str, Any]]:
    """The counters in Habana's metric shapes: {"graph_compilation": {...}, "recipe_cache": {...}}."""
    with _lock:
        number, total = COUNTERS.compilations, COUNTERS.compile_time_us
        return {
            "graph_compilation": {"TotalNumber": number, "TotalTime": total, "AvgTime": total / number if number else 0,
                                  "Recompilations": COUNTERS.recompilations},
            "recipe_cache": {"TotalHit": COUNTERS.cache_hits, "TotalMiss": COUNTERS.cache_misses},
        }


# -- registration with dynamo ---------------------------------------------------------------------------------------
def _register() -> None:
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if BACKEND_NAME not in _COMPILER_FNS:
        register_backend(hpu_backend, name=BACKEND_NAME)


def install() -> None:
    """Make "hpu_backend" the emulated compiler where Habana's software is absent (cheap, idempotent)."""
    from hpu_nb.runtime.emulated_habana import real_habana_spec

    if real_habana_spec() is not None:
        return  # Habana's habana_frameworks.torch.dynamo registers its own hpu_backend
    from hpu_nb._import_hooks import after_import, is_initializing

    if "torch._dynamo" not in sys.modules:
        after_import("torch._dynamo", _register)
    elif not is_initializing("torch._dynamo"):
        _register()

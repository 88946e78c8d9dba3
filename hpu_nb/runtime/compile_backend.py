"""torch.compile's "hpu_backend" for the emulated Gaudi, its graph metrics and Habana's dynamic-shape switch.

On a Gaudi, Habana's `habana_frameworks.torch.dynamo.compile_backend` registers "hpu_backend" when its core loads
(eager mode, the default since 1.21, and lazy mode): TorchDynamo captures the graph, AOTAutograd splits forward and
backward, Habana's graph compiler builds recipes, and `metric_global("graph_compilation")` / `("recipe_cache")` count
what it did; `enable_dynamic_shape()` lets one recipe serve many shapes. The emulated Gaudi does the same capture and
split (AOTAutograd, torch's "aot_eager") and runs the graphs with the device's CPU kernels, counting the same things
for the same purpose: each graph dynamo hands it is a compilation (a recompilation when dynamo compiled that frame
before), each later call of a compiled graph a recipe-cache hit. Measured with torch 2.13 here: "aot_eager" works on
`hpu` tensors; "inductor" does not (no code generator for the `hpu` device), so the emulation runs the same code, not
faster. Memory stays exact: compiled graphs allocate through the device's counting allocator like eager ops do.

The dynamic-shape switch (PT_HPU_ENABLE_REFINE_DYNAMIC_SHAPES, default off as on a Gaudi) becomes torch.compile's
automatic dynamic shapes once the emulated backend is used: off, every new shape is a recompilation.

hpu_nb publishes `hpu_backend` under the `torch_dynamo_backends` entry point, which torch consults only when no
"hpu_backend" is registered, so plain `import torch` code finds it. Where Habana's software is installed, Habana's
backend is the one to use, and it is registered by importing Habana's core in eager *and* lazy mode (1.19's
`habana_frameworks/torch/core/__init__.py` imports `dynamo.compile_backend.backends`, whose `@register_backend`
registers it, in either mode). Its `register_backend` refuses a name taken ("duplicate name: hpu_backend"), so hpu_nb
must never leave its own function registered there: when torch loads the entry point on such a machine, the attribute
(resolved by this module's `__getattr__`) imports Habana's core and hands torch Habana's function to register, so
torch registers Habana's and a later `import habana_frameworks.torch.core` finds nothing in its way. The emulated
backend is `emulated_hpu_backend`; `hpu_backend` names whichever function torch should run here.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, NoReturn

from hpu_nb.emulator.habana import real_habana_spec

BACKEND_NAME = "hpu_backend"
HABANA_CORE = "habana_frameworks.torch.core"
REGISTRY_MODULE = "torch._dynamo.backends.registry"
DYNAMIC_SHAPES_ENV = "PT_HPU_ENABLE_REFINE_DYNAMIC_SHAPES"
_TRUE = ("1", "y", "yes", "t", "true", "on")


class CompileCounters:
    """What the emulated graph compiler did in this process (a plain class: this module loads on `import torch`)."""

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
    return os.environ.get(DYNAMIC_SHAPES_ENV, "").strip().lower() in _TRUE


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
    import torch  # noqa: PLC0415 -- lazy: this module loads on a Gaudi too (see runtime/base.py)

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
def __getattr__(name: str) -> Any:
    """`hpu_backend`, the entry point's target: the emulated backend, or on a machine with Habana's software Habana's
    own (its core imported now, so that Habana registers it once, before torch registers what this returns)."""
    if name != BACKEND_NAME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if real_habana_spec() is None:
        return emulated_hpu_backend
    return _habanas_for_torch()


def register() -> None:
    """Register the emulated backend now (what importing the emulated `habana_frameworks.torch.dynamo` does)."""
    from torch._dynamo.backends.registry import (  # noqa: PLC0415 -- lazy: torch._dynamo takes seconds to import
        _COMPILER_FNS,
        register_backend,
    )

    if BACKEND_NAME not in _COMPILER_FNS:
        register_backend(emulated_hpu_backend, name=BACKEND_NAME)


def make_way_for_habana() -> None:
    """Unregister the emulated backend if it is registered, so Habana's software can register its own on import."""
    registry = sys.modules.get("torch._dynamo.backends.registry")
    if registry is not None and registry._COMPILER_FNS.get(BACKEND_NAME) is emulated_hpu_backend:
        del registry._COMPILER_FNS[BACKEND_NAME]


def _habanas_for_torch() -> Callable[..., Any]:
    """Habana's hpu_backend, for torch's registry to register under the entry point's name.

    Importing Habana's core registers it; torch's `lookup_backend`, which asked for this attribute, then registers what
    it gets under the same name and would refuse a duplicate: so when torch's lookup is the caller, Habana's entry is
    taken out for torch to put back. Any other caller gets Habana's function and leaves the registry as it is.
    """
    from torch._dynamo.backends.registry import _COMPILER_FNS  # noqa: PLC0415 -- lazy: seconds to import

    make_way_for_habana()
    importlib.import_module(HABANA_CORE)
    habana = _COMPILER_FNS.get(BACKEND_NAME)
    if habana is None or habana is emulated_hpu_backend:
        return _no_habana_backend
    if _called_by_torchs_lookup():
        del _COMPILER_FNS[BACKEND_NAME]
    return habana


def _called_by_torchs_lookup() -> bool:
    frame: FrameType | None = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return False
        if frame.f_code.co_name == "lookup_backend" and frame.f_globals.get("__name__") == REGISTRY_MODULE:
            return True
        frame = frame.f_back
    return False


def _no_habana_backend(graph_module: Any, example_inputs: list[Any], **kwargs: Any) -> NoReturn:
    raise RuntimeError(
        "torch.compile(backend='hpu_backend') needs Habana's own backend, and importing habana_frameworks.torch.core"
        " registered none (Gaudi software 1.19 and newer register it in eager and lazy mode). Check the Gaudi software"
        " installation (habana-torch-plugin), or run without torch.compile."
    )


def _habanas(graph_module: Any, example_inputs: list[Any], **kwargs: Any) -> Callable[..., Any]:
    """The emulated backend was registered before Habana's software was found (a process that started emulated):
    hand the graph to Habana's backend, registered in its place."""
    from torch._dynamo.backends.registry import _COMPILER_FNS  # noqa: PLC0415 -- lazy: seconds to import

    make_way_for_habana()
    importlib.import_module(HABANA_CORE)
    habana = _COMPILER_FNS.get(BACKEND_NAME)
    if habana is None:
        _COMPILER_FNS[BACKEND_NAME] = emulated_hpu_backend
        return _no_habana_backend(graph_module, example_inputs, **kwargs)
    return habana(graph_module, example_inputs, **kwargs)

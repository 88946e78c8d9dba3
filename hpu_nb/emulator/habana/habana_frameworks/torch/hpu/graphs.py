"""habana_frameworks.torch.hpu.graphs, emulated: HPU graphs (lazy mode only, as in Habana's software).

On a Gaudi an HPU graph is captured once and replayed without host overhead. The emulated Gaudi has no graph to
capture, and says so once: `wrap_in_hpu_graph`, `make_graphed_callables` and `ModuleCacher` return the module (or
callable) unchanged; `HPUGraph` records the ops run between `capture_begin()` and `capture_end()` and `replay()` runs
them again, in order, on the same tensors - so a training loop that copies new data into its static inputs and
replays gets the results a Gaudi would (static shapes, and Python values read during the capture stay fixed, as on a
Gaudi), only without the speed-up.
"""

from __future__ import annotations

import collections
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["CachedParams", "HPUGraph", "ModuleCacher", "copy_to", "graph", "input_hash", "make_graphed_callables",
           "wrap_in_hpu_graph", "wrap_in_hpu_graph_func"]

NOTICE = (
    "hpu_nb: the emulated Gaudi captures no HPU graph: wrapped modules and graphed callables run unchanged, and"
    " HPUGraph.replay() runs the captured ops again, eagerly on the CPU (same results, no graph speed-up)."
)
_said = False


class HPUGraphEmulationWarning(UserWarning):
    """Said once per process: HPU graphs are emulated, not captured."""


def say_once() -> None:
    global _said
    if not _said:
        _said = True
        warnings.warn(NOTICE, HPUGraphEmulationWarning, stacklevel=3)


class _Recorder(TorchDispatchMode):
    """Runs every op as usual and keeps (op, arguments, outputs) for replay."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[Any, tuple, dict, Any]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
            and a.storage_offset() == b.storage_offset() and a.stride() == b.stride())


class HPUGraph:
    """An HPU graph: `capture_begin()` ... `capture_end()`, then `replay()` (emulated: the recorded ops run again)."""

    def __init__(self) -> None:
        self._recorder: _Recorder | None = None
        self._ops: list[tuple[Any, tuple, dict, Any]] = []

    def capture_begin(self, dry_run: bool = False) -> None:
        say_once()
        self._recorder = _Recorder()
        self._recorder.__enter__()

    def capture_end(self) -> None:
        if self._recorder is None:
            raise RuntimeError("HPUGraph.capture_end() without capture_begin().")
        self._recorder.__exit__(None, None, None)
        self._ops, self._recorder = self._recorder.ops, None

    def replay(self, asynchronous: bool = False) -> None:
        """Run the captured ops again on the same tensors; results land in the tensors the capture produced."""
        if self._recorder is not None:
            raise RuntimeError("HPUGraph.replay() during its capture: call capture_end() first.")
        with torch.no_grad():
            for func, args, kwargs, recorded in self._ops:
                fresh = func(*args, **kwargs)
                olds, _ = tree_flatten(recorded)
                news, _ = tree_flatten(fresh)
                for old, new in zip(olds, news):
                    if not isinstance(old, torch.Tensor) or old is new or _same_memory(old, new):
                        continue
                    if old.shape != new.shape:
                        raise RuntimeError(
                            f"HPUGraph.replay(): {func} gave shape {tuple(new.shape)}, but {tuple(old.shape)} when"
                            " captured. An HPU graph replays static shapes: copy new data into the captured inputs."
                        )
                    old.copy_(new)

    def reset(self) -> None:
        self._ops = []

    def clear_inputs(self) -> None:
        pass

    def mark_user_inputs(self, static_tlist: list[torch.Tensor]) -> None:
        pass

    def mark_user_outputs(self, static_tlist: list[torch.Tensor]) -> None:
        pass

    def __repr__(self) -> str:
        return f"<HPUGraph (emulated): {len(self._ops)} recorded ops>"


class graph:
    """`with hthpu.graph(g): ...` captures the block into `g`."""

    def __init__(self, hpu_graph: HPUGraph, stream: Any = None, dry_run: bool = False) -> None:
        self.hpu_graph = hpu_graph
        self.dry_run = dry_run

    def __enter__(self) -> None:
        torch.hpu.synchronize()
        self.hpu_graph.capture_begin(dry_run=self.dry_run)

    def __exit__(self, *exc: Any) -> bool:
        self.hpu_graph.capture_end()
        return False


def make_graphed_callables(callables: Any, sample_args: Any, warmups: int = 0, allow_unused_input: bool = False,
                           asynchronous: bool = False, disable_tensor_cache: bool = False,
                           dry_run: bool = False) -> Any:
    """The callables, unchanged (a tuple for a tuple): on the emulated Gaudi there is no graph to replay."""
    say_once()
    return callables


def wrap_in_hpu_graph(module: torch.nn.Module, asynchronous: bool = False, disable_tensor_cache: bool = False,
                      dry_run: bool = False, max_graphs: int | None = None) -> torch.nn.Module:
    """The module, unchanged, with Habana's `clear_cache()` / `clear_inputs()` (nothing to clear here)."""
    say_once()
    module.clear_cache = lambda: None  # type: ignore[assignment]
    module.clear_inputs = lambda: None  # type: ignore[assignment]
    return module


def wrap_in_hpu_graph_func(func: Callable, asynchronous: bool = False, disable_tensor_cache: bool = False,
                           dry_run: bool = False, max_graphs: int | None = None) -> Callable:
    say_once()
    return func


class ModuleCacher:
    """`ModuleCacher(max_graphs=10)(model=model, inplace=True)`: the model, unchanged."""

    def __init__(self, max_graphs: int = 10) -> None:
        self.max_graphs = max_graphs

    def __call__(self, model: torch.nn.Module, inplace: bool = True, allow_unused_input: bool = False,
                 asynchronous: bool = False, have_grad_accumulation: bool = False, verbose: bool = False,
                 max_graphs: int | None = None, disable_tensor_cache: bool = False, dry_run: bool = False,
                 **kwargs: Any) -> torch.nn.Module:
        say_once()
        return model


# -- the helpers Gaudi code uses to keep its own cache of graphs (optimum-habana's diffusion pipelines do) --


class CachedParams:
    """One cached graph with its static inputs and outputs (the bridge's record, field for field)."""

    def __init__(self, graph_inputs: Any, graph_outputs: Any, graph: Any, out_tinfo_list: Any = None,
                 asynchronous: bool = False) -> None:
        self.graph_inputs = graph_inputs
        self.graph_outputs = graph_outputs
        self.graph = graph
        self.out_tinfo_list = out_tinfo_list
        self.asynchronous = asynchronous


def _autocast_on() -> bool:
    return torch.is_autocast_enabled("hpu")


def _view_signature(t: torch.Tensor) -> tuple:
    """What the bridge's view hash tells apart: the layout of the view over its storage (and its dtype)."""
    return (t.dtype, tuple(t.stride()), t.storage_offset())


def input_hash(obj: Any) -> int:
    """A key for a graph cache, as the bridge computes it: shapes and views of the tensors, other values by hash,
    nested through dicts, lists and tuples; whether hpu autocast is on is part of it (another graph runs then)."""
    if isinstance(obj, dict):
        return input_hash(tuple(obj.items()))
    if isinstance(obj, list) or (isinstance(obj, tuple) and not isinstance(obj, torch.Size)):
        return hash((tuple(input_hash(el) for el in obj), _autocast_on()))
    if torch.is_tensor(obj):
        return hash((obj.shape, _view_signature(obj), _autocast_on()))
    if isinstance(obj, collections.UserDict):
        return hash(tuple((k, tuple(v)) for k, v in obj.items()))
    return hash((obj, _autocast_on()))


def copy_to(dst: Any, src: Any) -> None:
    """Copy new inputs into a cached graph's static inputs, through the same nesting (types must match)."""
    assert type(dst) is type(src), f"copy_to: {type(dst).__name__} and {type(src).__name__} differ"
    if isinstance(dst, dict):
        for (dk, dv), (sk, sv) in zip(dst.items(), src.items()):
            assert dk == sk, f"copy_to: keys {dk!r} and {sk!r} differ"
            copy_to(dv, sv)
    elif isinstance(dst, list) or (isinstance(dst, tuple) and not isinstance(dst, torch.Size)):
        for d, s in zip(dst, src):
            copy_to(d, s)
    elif torch.is_tensor(dst):
        dst.copy_(src, non_blocking=True)

"""habana_frameworks.torch.utils.experimental.detect_recompilation, emulated: find what makes a model recompile.

Models the bridge's module of that name: `detect_recompilation_auto_model(model)` wraps the forward of the model and
of every submodule; each call logs, in Habana's line format, whether its input / output signature is new
(`hpu.graphs.input_hash`) and how many graphs were compiled during it (hthpu.metrics "graph_compilation");
`model.raw_logs()` gives the lines and `model.analyse_dynamicity()` prints the tables and writes the two CSV files.
`data_dynamicity(loader)` and `const_shape_dataloader(loader, maxlen)` look at the data instead.

On the emulated Gaudi the only graphs compiled are torch.compile's (backend "hpu_backend"): a module run eagerly, or
in lazy mode, never counts as recompiled, while its new input signatures are still reported. `analyse_dynamicity()`
says so before Habana's tables (so that empty tables do not read as "no recompilation"), and lists after them the new
input signatures, past the first step, of modules that compiled nothing here: where a Gaudi would compile a new graph
(in lazy mode, whose graphs this tool cuts at every module by its mark_steps; under torch.compile without dynamic
shapes). Habana's tables, CSV files and returned counts hold only what was measured. The emulated card runs
synchronously, so `waittime` (Habana sleeps to let its compile counters settle) is accepted and not slept.
"""

from __future__ import annotations

import csv
import inspect
from collections.abc import Iterable
from types import MethodType
from typing import Any

import habana_frameworks.torch.core as htcore
import torch
from habana_frameworks.torch.hpu.graphs import input_hash
from habana_frameworks.torch.hpu.metrics import metric_localcontext
from torch.utils.data import DataLoader

from hpu_nb.emulator import graph_compiler

__emulated__ = True
TAG = "[DETECT_RECOMPILE_AUTO]"
DYNSHAPE_FIELD = "_dynshape_info"


class _Detector:
    """The log of one wrapped model: Habana's text lines, and the same facts as records for the analysis."""

    def __init__(self, csv_out: str) -> None:
        self.lines: list[str] = []
        self.records: list[dict[str, Any]] = []
        self.defined_in: dict[str, tuple[str, str]] = {}
        self.step = -1
        self.csv_out = csv_out


def _wrap_forward(module: torch.nn.Module, name: str, level: int, detector: _Detector) -> None:
    original = module.forward
    seen_in: set[int] = set()
    seen_out: set[int] = set()

    def forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        assert not (torch.distributed.is_available() and torch.distributed.is_initialized()), (
            "Expected 1x run, but torch being used in distributed fashion")
        if level == 0:
            detector.step += 1
        in_hash = input_hash((args, kwargs))
        htcore.mark_step()
        with metric_localcontext("graph_compilation") as local_metric:
            out = original(*args, **kwargs)
            htcore.mark_step()
        num_graphs = dict(local_metric.stats()).get("TotalNumber", 0)
        out_hash = input_hash(out)
        new_in, new_out = in_hash not in seen_in, out_hash not in seen_out
        seen_in.add(in_hash)
        seen_out.add(out_hash)
        step = f"step:{detector.step}" if level == 0 else ""
        detector.lines.append(
            f"{'  ' * level}{TAG}[{name}]{step} {'Found new input signature ' if new_in else ''}"
            f"{'Found new output signature ' if new_out else ''}num_graphs:{num_graphs} "
            + ("Recompilation!" if num_graphs else ""))
        detector.records.append(dict(step=detector.step, module=name, new_in=new_in, new_out=new_out,
                                     num_graphs=num_graphs))
        return out

    module.forward = MethodType(forward, module)


def _register(module: torch.nn.Module, name: str, level: int, detector: _Detector) -> None:
    if hasattr(module, DYNSHAPE_FIELD):
        return  # shared by two parents: wrapped once, as Habana's does
    setattr(module, DYNSHAPE_FIELD, {"name": name})
    module.__name__ = name
    where = inspect.getmodule(module)
    detector.defined_in[name] = (module.__class__.__name__, getattr(where, "__file__", None) or str(where))
    detector.lines.append(f"{'  ' * level}{TAG} Registering hooks for {name} of type {module.__class__} probably"
                          f" defined here {where}")
    _wrap_forward(module, name, level, detector)
    for child_name, child in module.named_children():
        _register(child, f"{name}/{child_name}", level + 1, detector)


def _comment(record: dict[str, Any]) -> str:
    if record["new_in"]:
        return "Recompiled due to new input shape"
    if record["new_out"]:
        return "Already processed input shape still recompiled and has new output shape. Maybe dyn ops"
    return "Already processed input shape still recompiled. Maybe dyn ops"


def _analyse(detector: _Detector) -> dict[str, int]:
    """Print the recompiling modules per step and per module, write <csv_out>_1.csv / _2.csv; return the counts."""
    rows, counts = [], {}
    for r in detector.records:
        if not r["num_graphs"] or r["step"] == 0:  # everything compiles in the first step
            continue
        cls, where = detector.defined_in[r["module"]]
        rows.append([r["step"], r["module"], r["new_in"], r["new_out"], cls, where, _comment(r)])
        counts[r["module"]] = counts.get(r["module"], 0) + 1
    per_step = [["Step", "Recompiling modules", "New in", "New out", "Class", "Location", "Comment"], *rows]
    per_module = [["Module name", "Recompile count"], *sorted(counts.items(), key=lambda kv: -kv[1])]
    print(_emulation_note(detector))
    for table, suffix in ((per_step, "_1.csv"), (per_module, "_2.csv")):
        print(_as_text(table))
        with open(detector.csv_out + suffix, "w", newline="") as f:
            csv.writer(f).writerows(table)
    unseen = _would_recompile_on_a_gaudi(detector)
    if unseen:
        print(unseen)
    return counts


def _emulation_note(detector: _Detector) -> str:
    """What the emulated Gaudi can and cannot see, said before Habana's tables."""
    note = (f"{TAG} Emulated Gaudi: num_graphs and the tables below count only the graphs that "
            "torch.compile(backend=\"hpu_backend\") compiled (dynamo's recompilations included). Modules run eagerly"
            " or in lazy mode compile no graph on the emulated card, so they never show as recompiling here.")
    if not any(r["num_graphs"] for r in detector.records):
        note += (" No module compiled a graph in this run: empty tables mean 'not seen on the emulated Gaudi',"
                 " not 'no recompilation on a Gaudi'.")
    return note


def _would_recompile_on_a_gaudi(detector: _Detector) -> str:
    """The new input signatures after the first step of modules that compiled nothing here, as a table ("" if none)."""
    rows = [[r["step"], r["module"], detector.defined_in[r["module"]][0]] for r in detector.records
            if r["step"] > 0 and r["new_in"] and not r["num_graphs"]]
    if not rows:
        return ""
    if htcore.is_lazy():
        where = ("In lazy mode a Gaudi compiles a new graph for each of these (this tool's mark_steps make every"
                 " module a graph)")
    else:
        where = ("A Gaudi compiles a new graph for each of these where the module runs compiled (torch.compile"
                 " without dynamic shapes, or lazy mode); run eagerly, as here, it compiles none")
    if graph_compiler.dynamic_shapes_enabled():
        where += "; with dynamic shapes on, a dynamic recipe may serve some of them without recompiling"
    header = [["Step", "Module with a new input signature", "Class"]]
    return f"{TAG} Not compiled on the emulated Gaudi, new input signatures after the first step. {where}:\n" + \
        _as_text(header + rows)


def _as_text(table: list[list[Any]]) -> str:
    widths = [max(len(str(row[i])) for row in table) for i in range(len(table[0]))]
    return "\n".join(" | ".join(str(v).ljust(w) for v, w in zip(row, widths)) for row in table)


def detect_recompilation_auto_model(model: torch.nn.Module, mdlname: str = "Net", waittime: float = 1,
                                    csv_out: str = "out") -> torch.nn.Module:
    """The model, its forwards (and its submodules') wrapped, with `raw_logs()` and `analyse_dynamicity()` added."""
    assert not hasattr(model, "raw_logs"), "The model already has field raw_logs"
    assert not hasattr(model, "analyse_dynamicity"), "The model already has field analyse_dynamicity"
    detector = _Detector(csv_out)
    _register(model, mdlname, 0, detector)
    model.raw_logs = MethodType(lambda self: detector.lines, model)
    model.analyse_dynamicity = MethodType(lambda self: _analyse(detector), model)
    return model


def get_shape(item: Any) -> Any:
    """The shape signature of a batch: tensor shapes, nested through lists, tuples and dicts; other values by hash."""
    if isinstance(item, torch.Tensor):
        return tuple(item.shape)
    if isinstance(item, (list, tuple)):
        return tuple(get_shape(k) for k in item)
    if isinstance(item, dict):
        return tuple((get_shape(k), get_shape(v)) for k, v in item.items())
    return hash(item)


def data_dynamicity(dl: Iterable[Any]) -> dict[Any, int]:
    """How many batches of each shape the loader gives (printed with Habana's verdict, and returned)."""
    assert not (torch.distributed.is_available() and torch.distributed.is_initialized()), (
        "Expected 1x run, but torch being used in distributed fashion")
    hist: dict[Any, int] = {}
    for batch in dl:
        key = get_shape(batch)
        hist[key] = hist.get(key, 0) + 1
    print(_as_text([["Shape", "Count"], *sorted(hist.items(), key=lambda kv: -kv[1])]))
    n = len(hist)
    print("Number of unique shapes: ", n)
    if n == 0:
        print("Dataset looks empty")
    else:
        amount = "a lot of" if n > 20 else "some" if n > 5 else "a little" if n > 1 else "no"
        print(f"There is {amount} dynamicity in input data shapes")
    return hist


def const_shape_dataloader(dl: Iterable[Any], maxlen: int) -> DataLoader:
    """A loader of at most `maxlen` batches of one shape: the first shape to reach maxlen, else the most common."""
    by_shape: dict[Any, list[Any]] = {}
    for batch in dl:
        same = by_shape.setdefault(get_shape(batch), [])
        if len(same) == maxlen:
            return DataLoader(same, batch_size=None, collate_fn=None)
        same.append(batch)
    longest: list[Any] | None = max(by_shape.values(), key=len, default=None)
    assert longest, "Perhaps dataset is empty"
    return DataLoader(longest, batch_size=None, collate_fn=None)

"""habana_frameworks.torch.hpu.metrics, emulated: Habana's global metrics, from what the emulated Gaudi does.

`metric_global(name)` returns None for a name this release does not know, as Habana's does; "recipe_cache" exists only
with PT_HPU_ENABLE_CACHE_METRICS=1. graph_compilation / recipe_cache count the emulated `hpu_backend`'s work
(hpu_nb.emulator.graph_compiler: torch.compile compilations, recompilations and compiled-graph reuse): the emulated
card runs everything else eagerly, so it compiles nothing else, falls back to the CPU for nothing and never
defragments its memory. Each metric says so in its repr (`what_it_sees()` gives the sentence): a zero here means
"not seen on the emulated card", not "none on a Gaudi".
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

from hpu_nb.emulator import graph_compiler
from hpu_nb.runtime.env import is_true

__emulated__ = True
__all__ = ["metric_global", "metric_localcontext", "metrics_dump"]
CACHE_METRICS_ENV = "PT_HPU_ENABLE_CACHE_METRICS"


_SEES = {
    "graph_compilation": "counts only the graphs torch.compile(backend='hpu_backend') compiled (recompilations"
                         " included); ops run eagerly or in lazy mode compile nothing on the emulated card (on a"
                         " Gaudi, lazy mode compiles their graphs)",
    "recipe_cache": "a hit is a later call of an hpu_backend graph, a miss its compilation; nothing else is cached"
                    " here",
    "cpu_fallback": "always 0: the emulated card runs every op itself (on the CPU), so nothing falls back",
    "memory_defragmentation": "always 0: the emulated card never defragments its memory",
}


class Metric:
    """One of Habana's metrics: `name()`, `stats()` -> [(tag, value), ...], `reset()`."""

    def __init__(self, name: str, baseline: dict[str, Any] | None = None) -> None:
        self._name = name
        self._baseline = baseline or {}

    def name(self) -> str:
        return self._name

    def _current(self) -> dict[str, Any]:
        """The counters under Habana's tags, in Habana's order (bridge: hpu/metrics/metrics.py), and no others."""
        counted = graph_compiler.stats()
        if self._name == "graph_compilation":
            graphs = counted["graph_compilation"]
            return {tag: graphs[tag] for tag in ("TotalNumber", "TotalTime", "AvgTime")}
        if self._name == "recipe_cache":  # one recipe per graph: no per-recipe breakdown to give
            cache = counted["recipe_cache"]
            return {"TotalHit": cache["TotalHit"], "RecipeHit": {}, "TotalMiss": cache["TotalMiss"], "RecipeMiss": {}}
        if self._name == "cpu_fallback":  # nothing of the kind happens on the emulated card
            return {"TotalNumber": 0, "FallbackOps": {}}
        return {"TotalNumber": 0, "TotalSuccessful": 0, "AvgTime": 0, "MaxTime": 0}

    def stats(self) -> list[tuple[str, Any]]:
        current = self._current()
        out = {}
        for tag, value in current.items():
            base = self._baseline.get(tag, 0)
            out[tag] = value - base if isinstance(value, (int, float)) and tag != "AvgTime" else value
        if "AvgTime" in out and "TotalNumber" in out and "TotalTime" in out:
            out["AvgTime"] = out["TotalTime"] / out["TotalNumber"] if out["TotalNumber"] else 0
        return list(out.items())

    def reset(self) -> None:
        self._baseline = dict(self._current())

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def what_it_sees(self) -> str:
        """What this metric counts on the emulated Gaudi, and what it cannot see (emulated Gaudi only)."""
        return f"{self._name} on the emulated Gaudi {_SEES.get(self._name, 'is not measured: always 0')}."

    def __repr__(self) -> str:
        return f"<Metric {self._name} {dict(self.stats())} ({self.what_it_sees()})>"


def _known() -> tuple[str, ...]:
    names = ("graph_compilation", "cpu_fallback", "memory_defragmentation")
    if is_true(os.environ.get(CACHE_METRICS_ENV)):
        names += ("recipe_cache",)
    return names


_globals: dict[str, Metric] = {}


def metric_global(name: str) -> Metric | None:
    """The process-wide metric `name`, or None when this release has no such metric."""
    if name not in _known():
        return None
    return _globals.setdefault(name, Metric(name))


@contextlib.contextmanager
def metric_localcontext(name: str) -> Iterator[Metric]:
    """A metric that counts only what happens inside the block."""
    if name not in _known():
        raise KeyError(f"Metric with given name ({name}) doesn't exist.")
    metric = Metric(name)
    metric.reset()
    yield metric


def metrics_dump(file_name: str, format: str = "json") -> None:
    """Write every global metric to `file_name` (JSON)."""
    data = [{"metric_name": name, "statistics": dict(metric_global(name).stats())} for name in _known()]
    with open(file_name, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2)

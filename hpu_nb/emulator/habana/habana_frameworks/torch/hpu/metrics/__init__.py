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

from habana_frameworks.torch.hpu.metrics.exceptions import (
    InvalidMetricDumpFileFormat,
    InvalidMetricDumpTrigger,
    MetricNotFound,
)

from hpu_nb.emulator import graph_compiler
from hpu_nb.runtime.env import is_true

__emulated__ = True
__all__ = ["InvalidMetricDumpFileFormat", "InvalidMetricDumpTrigger", "MetricNotFound", "metric_global",
           "metric_localcontext", "metrics_dump"]
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
    """One of Habana's metrics: `name()`, `stats()` -> [(tag, value), ...], `reset()`, `start()`, `stop()`.

    It counts from when it is made (Habana's subscribe to their events in __init__) until `stop()`; `start()` counts
    again from then on (what happened while stopped is not counted), `reset()` sets the counts to 0."""

    def __init__(self, name: str, baseline: dict[str, Any] | None = None) -> None:
        self._name = name
        self._baseline = baseline or {}
        self._stopped_at: dict[str, Any] | None = None  # the counters when stop() was called, while stopped

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

    def _counted(self) -> dict[str, Any]:
        return self._stopped_at if self._stopped_at is not None else self._current()

    def stats(self) -> list[tuple[str, Any]]:
        current = self._counted()
        out = {}
        for tag, value in current.items():
            base = self._baseline.get(tag, 0)
            out[tag] = value - base if isinstance(value, (int, float)) and tag != "AvgTime" else value
        if "AvgTime" in out and "TotalNumber" in out and "TotalTime" in out:
            out["AvgTime"] = out["TotalTime"] / out["TotalNumber"] if out["TotalNumber"] else 0
        return list(out.items())

    def reset(self) -> None:
        self._baseline = dict(self._counted())

    def start(self) -> None:
        """Count again (a no-op while counting): what happened since stop() is left out."""
        if self._stopped_at is None:
            return
        now = self._current()
        for tag, value in now.items():
            if isinstance(value, (int, float)):
                self._baseline[tag] = self._baseline.get(tag, 0) + value - self._stopped_at.get(tag, 0)
        self._stopped_at = None

    def stop(self) -> None:
        """Stop counting: stats() keep what was counted until now."""
        if self._stopped_at is None:
            self._stopped_at = self._current()

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
    """A metric that counts only what happens inside the block (stopped when it ends: read it afterwards, it keeps
    the block's counts). An unknown name raises MetricNotFound, as Habana's (metric_global returns None)."""
    if name not in _known():
        raise MetricNotFound(f"Metric with given name ({name}) doesn't exist.")
    metric = Metric(name)
    metric.reset()
    try:
        yield metric
    finally:
        metric.stop()


def metrics_dump(file_name: str, format: str = "json") -> None:
    """Write every global metric to `file_name` (JSON)."""
    data = [{"metric_name": name, "statistics": dict(metric_global(name).stats())} for name in _known()]
    with open(file_name, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2)

"""habana_frameworks.torch.hpu.metrics, emulated: Habana's global metrics, as far as the emulated Gaudi has them.

As in Habana's module: `metric_global(name)` returns None for a name it does not collect, recipe_cache exists only with
PT_HPU_ENABLE_CACHE_METRICS=1, and `.stats()` gives (tag, value) pairs with Habana's tags. graph_compilation counts the
graphs torch.compile(backend="hpu_backend") compiled in this process and the milliseconds it took; the emulated card
has no CPU fallbacks (every op runs on the CPU's kernels), defragments nothing and caches no recipes, so those stay 0.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from hpu_nb.runtime.emulated_habana import compile_backend

__emulated__ = True
_TRUE = ("y", "yes", "t", "true", "on", "1")


class _GlobalMetric:
    def __init__(self, name: str) -> None:
        self._name = name

    def name(self) -> str:
        return self._name

    def stats(self) -> list[tuple[str, Any]]:
        if self._name == "graph_compilation":
            count, total = compile_backend.COMPILED["graphs"], compile_backend.COMPILED["milliseconds"]
            return [("TotalNumber", count), ("TotalTime", total), ("AvgTime", total / count if count else 0)]
        if self._name == "cpu_fallback":
            return [("TotalNumber", 0), ("FallbackOps", {})]
        if self._name == "memory_defragmentation":
            return [("TotalNumber", 0), ("TotalSuccessful", 0), ("AvgTime", 0), ("MaxTime", 0)]
        return [("TotalHit", 0), ("RecipeHit", {}), ("TotalMiss", 0), ("RecipeMiss", {})]


def _enabled() -> tuple[str, ...]:
    names = ("graph_compilation", "cpu_fallback", "memory_defragmentation")
    if os.environ.get("PT_HPU_ENABLE_CACHE_METRICS", "").lower() in _TRUE:
        names += ("recipe_cache",)
    return names


def metric_global(name: str) -> Optional[_GlobalMetric]:
    """The global metric `name`, or None when this process does not collect it (as Habana's returns)."""
    return _GlobalMetric(name) if name in _enabled() else None

"""Fake habana_frameworks.torch.hpu.metrics: metric_global(name).stats() -> [(tag, value), ...].

As in Habana's metrics.py: graph_compilation, cpu_fallback and memory_defragmentation always exist, recipe_cache only
with PT_HPU_ENABLE_CACHE_METRICS=1; an unknown name gives None (not an error).
"""

import os

from habana_frameworks._fake import STATE as _STATE
from habana_frameworks._fake import recorded as _recorded

_ENABLED = [name for name in ("graph_compilation", "cpu_fallback", "memory_defragmentation")]
if os.environ.get("PT_HPU_ENABLE_CACHE_METRICS", "").lower() in ("y", "yes", "t", "true", "on", "1"):
    _ENABLED.append("recipe_cache")


class _GlobalMetric:
    def __init__(self, name):
        self._name = name

    def name(self):
        return self._name

    def stats(self):
        return list(_STATE.metrics[self._name].items())


@_recorded
def metric_global(name):
    return _GlobalMetric(name) if name in _ENABLED else None

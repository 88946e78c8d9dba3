"""Fake habana_frameworks.torch.hpu.metrics: metric_global(name).stats() -> [(tag, value), ...]."""

from habana_frameworks._fake import STATE as _STATE
from habana_frameworks._fake import recorded as _recorded


class _GlobalMetric:
    def __init__(self, name):
        self.name = name

    def stats(self):
        return list(_STATE.metrics[self.name].items())


@_recorded
def metric_global(name):
    if name not in _STATE.metrics:
        raise ValueError(f"Unknown metric {name!r}; known: {', '.join(_STATE.metrics)}")
    return _GlobalMetric(name)

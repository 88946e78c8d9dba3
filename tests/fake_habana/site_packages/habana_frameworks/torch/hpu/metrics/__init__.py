"""Fake habana_frameworks.torch.hpu.metrics: metric_global(name).stats() -> [(tag, value), ...], metric_localcontext.

As in Habana's metrics package (bridge: hpu/metrics/metrics.py): graph_compilation, cpu_fallback and
memory_defragmentation always exist, recipe_cache only with PT_HPU_ENABLE_CACHE_METRICS=1. metric_global gives None
for an unknown name (not an error); metric_localcontext raises MetricNotFound for one. A local metric counts the events
from its creation until the block ends (Habana's stop() unsubscribes it from the events); the fake's events are the
machine's counters (FakeHabana.set_metric), so a local metric counts their growth while it is subscribed.
"""

import contextlib
import os

from habana_frameworks._fake import STATE as _STATE
from habana_frameworks._fake import recorded as _recorded
from habana_frameworks.torch.hpu.metrics.exceptions import *  # noqa: F403 -- as Habana's package does
from habana_frameworks.torch.hpu.metrics.exceptions import MetricNotFound

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


class _LocalMetric:
    """Counts the growth of the machine's counters between start() (on creation) and stop()."""

    def __init__(self, name):
        self._name = name
        self._counted = {tag: 0 for tag, value in _STATE.metrics[name].items() if isinstance(value, (int, float))}
        self._since = None
        self.start()

    def name(self):
        return self._name

    def _now(self):
        return {tag: _STATE.metrics[self._name][tag] for tag in self._counted}

    def start(self):
        if self._since is None:
            self._since = self._now()

    def stop(self):
        if self._since is not None:
            now = self._now()
            for tag in self._counted:
                self._counted[tag] += now[tag] - self._since[tag]
            self._since = None

    def stats(self):
        counted = dict(self._counted)
        if self._since is not None:
            now = self._now()
            for tag in counted:
                counted[tag] += now[tag] - self._since[tag]
        return [(tag, counted.get(tag, value)) for tag, value in _STATE.metrics[self._name].items()]


@_recorded
def metric_global(name):
    return _GlobalMetric(name) if name in _ENABLED else None


@_recorded
@contextlib.contextmanager
def metric_localcontext(name):
    if name not in _ENABLED:  # raised on entering the block, as Habana's generator does
        raise MetricNotFound(f"Metric with given name ({name}) doesn't exist.")
    metric = _LocalMetric(name)
    try:
        yield metric
    finally:
        metric.stop()

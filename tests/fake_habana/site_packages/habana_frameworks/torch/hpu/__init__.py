"""Fake habana_frameworks.torch.hpu: device queries and memory counters, every call recorded."""

import sys

from habana_frameworks._fake import STATE as _STATE
from habana_frameworks._fake import device_index as _device_index
from habana_frameworks._fake import recorded as _recorded
from habana_frameworks.torch.hpu import metrics  # noqa: F401  (hthpu.metrics.metric_global)

hpu = sys.modules[__name__]  # public code calls hthpu.hpu.memory_stats(dev)


@_recorded
def init():
    return None


@_recorded
def is_available():
    return bool(_STATE.config.available and _STATE.config.device_count > 0)


@_recorded
def device_count():
    return _STATE.config.device_count if _STATE.config.available else 0


@_recorded
def get_device_name(device=None):
    _device_index(device)
    return _STATE.config.device_name


@_recorded
def current_device():
    return _STATE.config.current_device


@_recorded
def synchronize(device=None):
    return None


@_recorded
def is_autocast_hpu_enabled():
    return False


@_recorded
def memory_stats(device=None):
    return _STATE.card(_device_index(device)).stats()


@_recorded
def memory_allocated(device=None):
    return _STATE.card(_device_index(device)).in_use


@_recorded
def max_memory_allocated(device=None):
    return _STATE.card(_device_index(device)).max_in_use


@_recorded
def reset_peak_memory_stats(device=None):
    _STATE.card(_device_index(device)).reset_peak()


@_recorded
def mem_get_info(device=None):
    card = _STATE.card(_device_index(device))
    return card.limit - card.in_use, card.limit

"""Fake habana_frameworks.torch.hpu: device queries and memory, every call recorded.

Built on hpu_nb's emulated `hpu` device, so tests on the fake train real models on `hpu` tensors: the card this
process drives (hpu:0) counts real allocations, with the fake machine's Limit and device name. The other cards of the
fake machine exist only as facts (pyhlml / hl-smi), kept in habana_frameworks._fake.
"""

import sys

from habana_frameworks._fake import STATE as _STATE
from habana_frameworks._fake import device_index as _device_index
from habana_frameworks._fake import recorded as _recorded
from habana_frameworks.torch.hpu import metrics  # noqa: F401  (hthpu.metrics.metric_global)

hpu = sys.modules[__name__]  # public code calls hthpu.hpu.memory_stats(dev)
_initialized = False


def _card():
    """Load the emulated device as this fake machine's card (its Limit and generation)."""
    from hpu_nb.runtime import hpu_device
    from hpu_nb.runtime.generations import generation_from_name

    config = hpu_device.CardConfig(
        generation_from_name(_STATE.config.device_name), _STATE.config.limit(), max(_STATE.config.device_count, 1),
        device_count_is_explicit=True)
    if not hpu_device.is_loaded() or hpu_device.card_config() != config:
        hpu_device.load(config)
    return hpu_device


@_recorded
def _lazy_init():
    global _initialized
    _card()
    _initialized = True


@_recorded
def init():
    _lazy_init()


@_recorded
def is_initialized():
    return _initialized


@_recorded
def is_available():
    return bool(_STATE.config.available and _STATE.config.device_count > 0)


@_recorded
def device_count():
    return _STATE.config.device_count if _STATE.config.available else 0


@_recorded
def get_device_name(device=None):
    _lazy_init()  # as in Habana's bridge: asking the name acquires a card
    _device_index(device)
    return _STATE.config.device_name


@_recorded
def current_device():
    _lazy_init()
    return _STATE.config.current_device


@_recorded
def set_device(device):
    _device_index(device)


@_recorded
def synchronize(device=None):
    _lazy_init()


@_recorded
def is_autocast_hpu_enabled():
    return False


@_recorded
def memory_stats(device=None):
    _lazy_init()
    _device_index(device)
    return _card().memory_stats()


@_recorded
def memory_allocated(device=None):
    return memory_stats(device)["InUse"]


@_recorded
def max_memory_allocated(device=None):
    return memory_stats(device)["MaxInUse"]


@_recorded
def reset_peak_memory_stats(device=None):
    _device_index(device)
    _card().reset_peak_memory_stats()


@_recorded
def mem_get_info(device=None):
    stats = memory_stats(device)
    return stats["Limit"] - stats["InUse"], stats["Limit"]


@_recorded
def get_rng_state(device="hpu"):
    import torch

    return torch.get_rng_state()


@_recorded
def set_rng_state(new_state, device="hpu"):
    import torch

    torch.set_rng_state(new_state)

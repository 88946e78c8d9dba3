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


# -- dynamic shapes (Habana's switch, off by default; PT_HPU_ENABLE_REFINE_DYNAMIC_SHAPES at start) ------------------
import os as _os  # noqa: E402

_dynamic_shapes = _os.environ.get("PT_HPU_ENABLE_REFINE_DYNAMIC_SHAPES", "0").lower() in ("1", "true", "on", "yes")


@_recorded
def enable_dynamic_shape():
    global _dynamic_shapes
    _dynamic_shapes = True


@_recorded
def disable_dynamic_shape():
    global _dynamic_shapes
    _dynamic_shapes = False


@_recorded
def get_dynamic_shape_status():
    return _dynamic_shapes


# -- HPU graphs: in lazy mode only, like Habana's module (it imports .graphs only when is_lazy()). Every call is
# recorded; the work is done as the emulated device does it (capture records ops, replay re-runs them), so tests on
# the fake train for real.
_GRAPH_NAMES = ("HPUGraph", "graph", "make_graphed_callables", "wrap_in_hpu_graph", "ModuleCacher")


def _graph_impl():
    import importlib.util
    import sys as _sys

    name = "_fake_habana_graph_impl"
    if name not in _sys.modules:
        from hpu_nb.runtime.emulated_habana import ROOT

        spec = importlib.util.spec_from_file_location(name, ROOT / "torch" / "hpu" / "graphs.py")
        module = importlib.util.module_from_spec(spec)
        _sys.modules[name] = module
        spec.loader.exec_module(module)
        module._said = True  # a (fake) Gaudi captures graphs: nothing to say
    return _sys.modules[name]


def __getattr__(name):
    if name in _GRAPH_NAMES and _os.environ.get("PT_HPU_LAZY_MODE", "1").strip() != "0":
        impl = getattr(_graph_impl(), name)
        if isinstance(impl, type):
            class Recorded(impl):
                def __init__(self, *args, **kwargs):
                    _STATE.calls.record(f"{__name__}.{name}", args, kwargs)
                    super().__init__(*args, **kwargs)

            Recorded.__name__ = Recorded.__qualname__ = name
            return Recorded
        recorded = _recorded(impl)
        recorded.__module__ = __name__
        return recorded
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Fake habana_frameworks.torch.hpu (and so torch.hpu): device queries, card acquisition and memory, every call
recorded.

Built on hpu_nb's emulated `hpu` device, so tests on the fake train real models on `hpu` tensors: the card this
process drives counts real allocations, with the fake machine's Limit and device name. As in Habana's module:
- `is_available()` / `device_count()` read the machine without acquiring a card;
- `_lazy_init()` (torch calls it before the first hpu tensor; get_device_name, current_device, synchronize and the
  memory functions call it) acquires this process's card, logged with the process id in the machine's log;
  `is_initialized()` is True afterwards;
- a forked child of a process that acquired a card cannot use the device.
The other cards of the machine exist only as facts (pyhlml / hl-smi), kept in habana_frameworks._fake.
"""

import os
import sys

from habana_frameworks._fake import STATE as _STATE
from habana_frameworks._fake import device_index as _device_index
from habana_frameworks._fake import recorded as _recorded
from habana_frameworks.torch.hpu import metrics  # noqa: F401  (hthpu.metrics.metric_global)

hpu = sys.modules[__name__]  # public code calls hthpu.hpu.memory_stats(dev)
_initialized = False
_owner_pid = None  # the process that acquired the card
card = None  # the machine's card this process holds
_card_lock = None  # the held lock's file descriptor (released by the kernel when the process ends)


def _device():
    """Load the emulated device as this fake machine's card (its Limit and generation, and the release's op lists)."""
    from hpu_nb.emulator import hpu_device
    from hpu_nb.runtime.generations import generation_from_name

    config = hpu_device.CardConfig(
        generation_from_name(_STATE.config.device_name), _STATE.config.limit(), max(_STATE.config.device_count, 1),
        device_count_is_explicit=True)
    if not hpu_device.is_loaded() or hpu_device.card_config() != config:
        hpu_device.load(config)
    from habana_frameworks.torch.core import _autocast_lists

    _autocast_lists.apply()
    return hpu_device


def _check_process():
    if _initialized and os.getpid() != _owner_pid:
        raise RuntimeError(
            f"synStatus 26 [Generic failure]: the HPU was acquired by process {_owner_pid} before process {os.getpid()}"
            " was forked from it; a forked child cannot use the device its parent acquired")


@_recorded
def _lazy_init():
    global _initialized, _owner_pid, card, _card_lock
    _check_process()
    if _initialized:
        return
    if not _STATE.config.supports_device:
        raise RuntimeError(f"synStatus 26 [Generic failure]: {_STATE.config.device_name} is not supported by Gaudi"
                           f" software {_STATE.config.release}")
    if _STATE.machine is None:
        raise RuntimeError("the fake Gaudi has no machine directory (install it with install_fake_habana)")
    card, _card_lock = _STATE.machine.acquire(_STATE.config.device_count if _STATE.config.available else 0)
    _owner_pid = os.getpid()
    _initialized = True
    from torch.utils.checkpoint import DefaultDeviceType

    DefaultDeviceType.set_device_type("hpu")
    _device()


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
    if not is_available():
        return ""
    _lazy_init()  # as in Habana's bridge: asking the name acquires a card
    _device_index(device)
    return _STATE.config.device_name


@_recorded
def current_device():
    _lazy_init()
    return _STATE.config.current_device


HABANA_VISIBLE_MODULES_VAR = "HABANA_VISIBLE_MODULES"
HLS_MODULE_ID_VAR = "HLS_MODULE_ID"


def _get_available_modules_from_environ():
    """As the bridge's hpu/_utils.py: the visible modules as ints (int() of each: a stray separator raises)."""
    modules = [int(x) for x in os.getenv(HABANA_VISIBLE_MODULES_VAR, "0,1,2,3,4,5,6,7").split(",")]
    assert 0 < len(modules) <= 8, f"{HABANA_VISIBLE_MODULES_VAR} does not have valid value."
    return modules


def _get_module_id_from_environ():
    value = os.getenv(HLS_MODULE_ID_VAR, -1)
    return int(value) if value else -1


def _get_device_index(device, optional=False):
    """As the bridge's: an int as is, "hpu[:n]" / torch.device("hpu"[, n]); no index: the current device."""
    import torch

    if isinstance(device, str):
        device = torch.device(device)
    index = None
    if isinstance(device, torch.device):
        if device.type != "hpu":
            raise ValueError(f"Expected a hpu device, but got: {device}")
        index = device.index
    elif isinstance(device, int):
        index = device
    if index is None:
        if not optional:
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
        index = current_device()
    return index


@_recorded
def set_device(device):
    """As the bridge's hpu.set_device (1.19): checks the index against HABANA_VISIBLE_MODULES, keeps to the module an
    earlier HLS_MODULE_ID names (asserting it is visible), and sets HLS_MODULE_ID; without HABANA_VISIBLE_MODULES or
    HLS_MODULE_ID on a machine of fewer than 8 cards only index 0 is allowed (the card is then acquired by type)."""
    index = _get_device_index(device, optional=True)
    available = _get_available_modules_from_environ()
    if index not in available and index > len(available):
        raise AssertionError(f"Trying to open device with idx={index} when only {available} are avaliable)")
    current = _get_module_id_from_environ()
    if current >= 0:
        for candidate in range(device_count()):
            if available[candidate] == current:
                index = candidate
                break
        assert available[index] == current, (
            f"Requested module_id={available[index]} is different from current_module_id={current} which was"
            " previously set.")
    if current == -1 and HABANA_VISIBLE_MODULES_VAR not in os.environ and device_count() < 8:
        assert index == 0, f"As {HABANA_VISIBLE_MODULES_VAR} is not provided, the only supported device idx is 0."
    else:
        os.environ[HLS_MODULE_ID_VAR] = str(available[index])
    set_device.current_device_idx = index


set_device.current_device_idx = -1


class device:
    """Context manager selecting a device (torch.load uses it for hpu tensors); one card per process, hpu:0."""

    def __init__(self, device):
        negative = isinstance(device, int) and device < 0
        self.idx = -1 if device is None or negative else _device_index(device)

    def __enter__(self):
        if self.idx >= 0:
            _lazy_init()

    def __exit__(self, *exc):
        return False


class device_of(device):
    def __init__(self, obj):
        super().__init__(obj.get_device() if obj.device.type == "hpu" else -1)


@_recorded
def synchronize():
    _lazy_init()


@_recorded
def is_autocast_hpu_enabled():
    return False


@_recorded
def is_bf16_supported():
    return is_available()


@_recorded
def memory_stats(device=None):
    _lazy_init()
    _device_index(device)
    return _device().memory_stats()


@_recorded
def memory_allocated(device=None):
    return memory_stats(device)["InUse"]


@_recorded
def max_memory_allocated(device=None):
    return memory_stats(device)["MaxInUse"]


@_recorded
def reset_peak_memory_stats(device=None):
    _lazy_init()
    _device_index(device)
    _device().reset_peak_memory_stats()


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


@_recorded
def manual_seed(seed):
    import torch

    return torch.manual_seed(seed)


@_recorded
def manual_seed_all(seed):
    import torch

    torch.manual_seed(seed)


# -- dynamic shapes (Habana's switch, off by default; PT_HPU_ENABLE_REFINE_DYNAMIC_SHAPES at start) ------------------
_dynamic_shapes = os.environ.get("PT_HPU_ENABLE_REFINE_DYNAMIC_SHAPES", "0").lower() in ("1", "true", "on", "yes")


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


# -- legacy tensor types (hthpu.LongTensor([...])), as the bridge's hpu/__init__.py makes them: the device keyword is
# compared with the string "hpu", so "hpu:0" and torch.device("hpu") are refused with its message.
def _create_tensor_alias(name, dtype):
    import torch

    class TypeFabric(torch.Tensor):
        @staticmethod
        def __new__(cls, *args, **kwargs):
            _STATE.calls.record(f"{__name__}.{name}", args, kwargs)
            device = kwargs.get("device")
            if device is not None and device != "hpu":
                raise RuntimeError(f"legacy constructor expects device type: hpu but device type: {device} was passed")
            requested = kwargs.get("dtype")
            if requested is not None and requested != dtype:
                raise RuntimeError(f"legacy constructor expects dtype: {dtype} but dtype: {requested} was passed")
            kwargs["device"], kwargs["dtype"] = "hpu", dtype
            return torch.Tensor._make_subclass(cls, torch.tensor(*args, **kwargs))

    TypeFabric.__name__ = TypeFabric.__qualname__ = name
    return TypeFabric


def _legacy_types():
    import torch

    dtypes = {"BFloat16Tensor": torch.bfloat16, "BoolTensor": torch.bool, "ByteTensor": torch.uint8,
              "CharTensor": torch.int8, "DoubleTensor": torch.float64, "FloatTensor": torch.float32,
              "HalfTensor": torch.float16, "IntTensor": torch.int32, "LongTensor": torch.int64,
              "ShortTensor": torch.int16}
    return {name: _create_tensor_alias(name, dtype) for name, dtype in dtypes.items()}


globals().update(_legacy_types())


# -- HPU graphs: in lazy mode only, like Habana's module (it imports .graphs only when is_lazy()). Every call is
# recorded; the work is done as the emulated device does it (capture records ops, replay re-runs them), so tests on
# the fake train for real.
_GRAPH_NAMES = ("HPUGraph", "graph", "make_graphed_callables", "wrap_in_hpu_graph", "ModuleCacher")


def _graph_impl():
    import importlib.util
    import sys as _sys

    name = "_fake_habana_graph_impl"
    if name not in _sys.modules:
        from hpu_nb.emulator.habana import ROOT

        spec = importlib.util.spec_from_file_location(name, ROOT / "torch" / "hpu" / "graphs.py")
        module = importlib.util.module_from_spec(spec)
        _sys.modules[name] = module
        spec.loader.exec_module(module)
        module._said = True  # a (fake) Gaudi captures graphs: nothing to say
    return _sys.modules[name]


def __getattr__(name):
    if name in _GRAPH_NAMES and os.environ.get("PT_HPU_LAZY_MODE", "1").strip() != "0":
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

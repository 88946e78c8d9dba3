"""habana_frameworks.torch.hpu, emulated, and therefore `torch.hpu`: the emulated Gaudi card this process drives.

Modelled on Habana's module (device queries, memory counters, RNG, device context); backed by hpu_nb's emulated
`hpu` device (hpu_nb.emulator.hpu_device). `get_device_name()` answers as a Gaudi would ("GAUDI2"); everything
hpu_nb shows says that the card is emulated, and so does this module's repr.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import types
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from habana_frameworks.torch.utils.internal import is_lazy
from torch.utils.checkpoint import DefaultDeviceType

from hpu_nb.emulator import graph_compiler, hpu_device
from hpu_nb.runtime import env

__emulated__ = True
from habana_frameworks.torch.hpu import metrics  # noqa: F401  (hthpu.metrics.metric_global, as Habana's)

_device_t = torch.device | str | int | None
_initialized = False
_init_lock = threading.Lock()


class _EmulatedModule(types.ModuleType):
    def __repr__(self) -> str:
        config = hpu_device.card_config()
        return f"<module {self.__name__!r} (emulated by hpu_nb: {config.generation.device_name} on the CPU)>"


# -- the device ----------------------------------------------------------------------------------------------------
def init() -> None:
    _lazy_init()


def _lazy_init() -> None:
    """Acquire this process's card (on the emulated Gaudi: load the device); torch calls it before the first tensor."""
    global _initialized
    if _initialized:
        return
    with _init_lock:
        if _initialized:
            return
        hpu_device.load()
        # As Habana does: activation checkpointing keeps hpu RNG state, not CUDA's.
        DefaultDeviceType.set_device_type("hpu")
        _initialized = True


def is_initialized() -> bool:
    return _initialized


def is_available() -> bool:
    return True


VISIBLE_MODULES_ENV = "HABANA_VISIBLE_MODULES"


def visible_modules() -> list[int]:
    """The machine's cards this process may use: all of them, or those HABANA_VISIBLE_MODULES lists (multi-tenancy:
    each job on a shared machine gets its own cards). A card the machine does not have is a clear error."""
    machine = hpu_device.card_config().device_count
    text = os.environ.get(VISIBLE_MODULES_ENV, "").strip()
    parts = env.visible_modules()
    if not parts:  # unset, empty or only separators (" , "): every card, as an unset variable
        return list(range(machine))
    try:
        ids = [int(part) for part in parts]
    except ValueError:
        raise ValueError(f"{VISIBLE_MODULES_ENV}={text!r} must list card numbers, e.g. '0,1'.") from None
    bad = [i for i in ids if not 0 <= i < machine]
    if bad or len(set(ids)) != len(ids):
        raise ValueError(
            f"{VISIBLE_MODULES_ENV}={text!r} names {'cards ' + str(bad) if bad else 'a card twice'}, but this emulated"
            f" machine has cards 0-{machine - 1} (HPU_NB_DEVICE_COUNT sets how many)."
        )
    return ids


def device_count() -> int:
    """Cards this process may use (see visible_modules); reading it acquires no card."""
    return len(visible_modules())


def _get_device_index(device: Any, optional: bool = False, allow_cpu: bool = False) -> int:
    if device is None:
        if not optional:
            raise ValueError("Expected a torch.device with a specified index or an integer, but got: None")
        return current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type == "cpu" and allow_cpu:
        return -1
    if device.type != "hpu":
        raise ValueError(f"Expected a hpu device, but got: {device}")
    return current_device() if device.index is None else device.index


def _check(device: _device_t) -> int:
    index = _get_device_index(device, optional=True)
    if index != 0:
        raise AssertionError(f"Invalid device id {index}: this process drives one HPU, hpu:0 (as on a Gaudi).")
    return index


def get_device_name(device: _device_t = None) -> str:
    _lazy_init()
    _check(device)
    return hpu_device.card_config().generation.device_name


def get_device_capability(device: _device_t = None) -> str:
    return get_device_name(device)


def get_device_properties(device: _device_t = None) -> str:
    config = hpu_device.card_config()
    return (f"(sramBaseAddress=0, dramBaseAddress=0, sramSize=0, dramSize={config.memory_limit}, tpcEnabledMask=0,"
            f" dramEnabled=1, fd=0, device_id=0, device_type={config.generation.device_name} (emulated))")


def current_device() -> int:
    _lazy_init()
    return 0


def set_device(device: _device_t) -> None:
    """Select the card by its index on the machine (launchers pass the local rank); the process still drives one card,
    which torch calls hpu:0, as on a Gaudi."""
    _lazy_init()
    index = _get_device_index(device, optional=True)
    if not 0 <= index < device_count():
        raise AssertionError(f"Trying to open device with idx={index} when only {device_count()} are available.")


def synchronize(device: _device_t = None) -> None:
    """Everything runs eagerly on the CPU: there is nothing in flight to wait for."""
    _lazy_init()


def is_bf16_supported() -> bool:
    return True


def get_amp_supported_dtype() -> list[torch.dtype]:
    gen = hpu_device.card_config().generation
    return [torch.bfloat16, torch.float16] if gen.supports_fp16 else [torch.bfloat16]


def _is_in_bad_fork() -> bool:
    return False


class device:
    """Context manager that makes `device` current (there is one card per process: hpu:0)."""

    def __init__(self, device: Any) -> None:
        self.idx = -1 if device is None else _get_device_index(device, optional=True)

    def __enter__(self) -> None:
        if self.idx >= 0:
            set_device(self.idx)

    def __exit__(self, *exc: Any) -> bool:
        return False


class device_of(device):
    def __init__(self, obj: torch.Tensor) -> None:
        super().__init__(obj.get_device() if obj.device.type == "hpu" else None)


# -- streams and events: the emulated card runs everything eagerly, in order, so each is complete when recorded ------
class Stream(torch.Stream):
    """An HPU stream (torch's own Stream type, so `tensor.record_stream` takes it). The emulated card runs in order
    and eagerly: work is finished when the call returns, so there is never anything to wait for."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> Stream:
        return super().__new__(cls, device=torch.device("hpu", _get_device_index(device, optional=True)),
                               priority=priority)

    def wait_event(self, event: Any) -> None:
        pass

    def wait_stream(self, stream: Any) -> None:
        pass

    def record_event(self, event: Event | None = None) -> Event:
        event = event if event is not None else Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"<torch.hpu.Stream device={self.device} (emulated: eager, in order)>"


class Event:
    """An HPU event: recorded work is complete; `elapsed_time` measures host time between two records, in ms."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self._recorded_at: float | None = None

    def record(self, stream: Stream | None = None) -> None:
        self._recorded_at = time.perf_counter()

    def wait(self, stream: Stream | None = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end_event: Event) -> float:
        if self._recorded_at is None or end_event._recorded_at is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._recorded_at - self._recorded_at) * 1000.0


_default_stream = None


def default_stream(device: _device_t = None) -> Stream:
    global _default_stream
    if _default_stream is None:
        _default_stream = Stream(device)
    return _default_stream


_tls_streams = threading.local()


def current_stream(device: _device_t = None) -> Stream:
    return getattr(_tls_streams, "stream", None) or default_stream(device)


def set_stream(stream: Stream) -> None:
    _tls_streams.stream = stream


@contextlib.contextmanager
def stream(stream: Stream | None) -> Iterator[None]:
    """Make `stream` current inside the block."""
    previous = getattr(_tls_streams, "stream", None)
    if stream is not None:
        _tls_streams.stream = stream
    try:
        yield
    finally:
        _tls_streams.stream = previous


# -- memory ------------------------------------------------------------------------------------------------------
def memory_stats(device: _device_t = None) -> dict[str, int]:
    """Gaudi's ten counters (Limit, InUse, MaxInUse, NumAllocs, ...), exact to the byte."""
    _lazy_init()
    _check(device)
    return hpu_device.memory_stats()


def memory_allocated(device: _device_t = None) -> int:
    return memory_stats(device)["InUse"]


def max_memory_allocated(device: _device_t = None) -> int:
    return memory_stats(device)["MaxInUse"]


def memory_reserved(device: _device_t = None) -> int:
    return memory_stats(device)["Limit"]


def max_memory_reserved(device: _device_t = None) -> int:
    return memory_stats(device)["Limit"]


def reset_peak_memory_stats(device: _device_t = None) -> None:
    _lazy_init()
    _check(device)
    hpu_device.reset_peak_memory_stats()


def mem_get_info(device: _device_t = None) -> tuple[int, int]:
    """(free, total) bytes of the card."""
    stats = memory_stats(device)
    return stats["Limit"] - stats["InUse"], stats["Limit"]


def memory_summary(device: _device_t = None) -> str:
    stats = memory_stats(device)
    config = hpu_device.card_config()
    lines = [f"HPU memory summary, device 0 ({config.label})"]
    lines += [f"  {key}: {value}" for key, value in stats.items()]
    return "\n".join(lines)



def memory_usage(device: _device_t = None) -> int:
    """Bytes in use on the card, as hl-smi would say (Habana's reads its InUse counter)."""
    return memory_stats(device)["InUse"]


def utilization(device: _device_t = None) -> int:
    """Habana's reads the card's utilization through hl-smi's library, pyhlml, and raises ModuleNotFoundError where
    it is absent. The emulated Gaudi has no hl-smi: the same error, saying so."""
    _lazy_init()
    _check(device)
    raise ModuleNotFoundError(
        "torch.hpu.utilization() reads the card's utilization through hl-smi's library pyhlml (Intel Gaudi software,"
        " package habana-pyhlml); the emulated Gaudi has no hl-smi, so there is no utilization figure to report.",
        name="pyhlml")


_SYNC_DEBUG_MODE_ENV = "PT_ENABLE_HABANA_STREAMASYNC"  # where Habana's set_sync_debug_mode keeps the mode
_SYNC_DEBUG_MODES = {"default": 0, "warn": 1, "error": 2}  # torch.cuda.set_sync_debug_mode's names for 0 / 1 / 2


def set_sync_debug_mode(debug_mode: int | str) -> None:
    """Kept where Habana's keeps it (PT_ENABLE_HABANA_STREAMASYNC); the emulated card runs every op eagerly, in
    order, so no mode changes what it does. CUDA's names ("default", "warn", "error") are its 0, 1, 2."""
    mode = _SYNC_DEBUG_MODES.get(debug_mode, debug_mode) if isinstance(debug_mode, str) else debug_mode
    if isinstance(mode, bool) or not isinstance(mode, int) or mode not in (0, 1, 2):
        raise RuntimeError(f"invalid value of debug_mode {debug_mode!r}, expected one of 0, 1, 2 or 'default', "
                           f"'warn', 'error'")
    os.environ[_SYNC_DEBUG_MODE_ENV] = str(mode)


def get_sync_debug_mode() -> int:
    """The mode set_sync_debug_mode kept; 0 (torch's default) where none was set (Habana's raises KeyError there)."""
    value = os.environ.get(_SYNC_DEBUG_MODE_ENV, "0").strip()
    return int(value) if value.isdigit() else 0


def can_device_access_peer(device: _device_t, peer_device: _device_t) -> bool:
    """As Habana's: any two different cards of this machine can reach each other; the same card twice
    or an index outside the machine's cards is an AssertionError."""
    _lazy_init()
    index, peer = _get_device_index(device, optional=True), _get_device_index(peer_device, optional=True)
    count = device_count()
    for checked in (index, peer):
        if not 0 <= checked < count:
            raise AssertionError(f"Invalid device id : {checked}")
    if index == peer:
        raise AssertionError("Both the ids are same.")
    return True


# -- Habana's own determinism switch (deprecated since 1.19; Habana's DeepSpeed 1.18 calls it at start-up) -----------
_deterministic = False  # Habana's HPUGlobalConfig flag: its own, not torch.use_deterministic_algorithms'


def setDeterministic(val: bool) -> None:
    """Habana's flag for its kernels' deterministic variants, with Habana's deprecation warning. The emulated card's
    kernels are the CPU's, which give the same results run to run, so the flag changes no result here."""
    global _deterministic
    warnings.warn("torch.hpu.setDeterministic is deprecated and will be removed in next release. Please use "
                  "torch.use_deterministic_algorithms instead.", stacklevel=2)
    _deterministic = bool(val)


def getDeterministic() -> bool:
    warnings.warn("torch.hpu.getDeterministic is deprecated and will be removed in next release. Please use "
                  "torch.are_deterministic_algorithms_enabled instead.", stacklevel=2)
    return _deterministic


# -- random numbers (hpu.random, as in Habana's package) -------------------------------------------------------------
from habana_frameworks.torch.hpu import random  # noqa: E402,F401
from habana_frameworks.torch.hpu.random import (  # noqa: E402, F401
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)


# -- dynamic shapes: Habana's switch; on the emulated Gaudi it governs the emulated hpu_backend's recompilations -------
def enable_dynamic_shape() -> None:
    graph_compiler.set_dynamic_shapes(True)


def disable_dynamic_shape() -> None:
    graph_compiler.set_dynamic_shapes(False)


def get_dynamic_shape_status() -> bool:
    return graph_compiler.dynamic_shapes_enabled()


# -- autocast state of the hpu device, as Habana's hpu module reads and sets it (torch's own per-device state) -------
def set_autocast_hpu_enabled(enabled: Any) -> None:
    """Like Habana's binding, only the object True enables (1 or "yes" disable)."""
    torch.set_autocast_enabled("hpu", enabled is True)


def is_autocast_hpu_enabled() -> bool:
    """True inside `torch.autocast("hpu", ...)` (optimum-habana's gradient checkpointing re-enters it with this)."""
    return torch.is_autocast_enabled("hpu")


def set_autocast_hpu_dtype(dtype: torch.dtype) -> None:
    torch.set_autocast_dtype("hpu", dtype)


def get_autocast_hpu_dtype() -> torch.dtype:
    """The hpu autocast dtype: the one given to torch.autocast("hpu") inside it, bfloat16 by default."""
    return torch.get_autocast_dtype("hpu")


# -- the fused-SDPA recompute switch (hpex.kernels.FusedSDPA reads it when called with recompute_mode=None) ----------
_recompute_sdp = True  # Habana's runtime default (backend/helpers/runtime_config.cpp): recompute enabled


def enable_recompute_sdp(enabled: bool) -> None:
    """Recompute FusedSDPA's attention probabilities in backward instead of keeping them (a memory trade on a Gaudi;
    the same numbers on the emulated one)."""
    global _recompute_sdp
    _recompute_sdp = bool(enabled)


def recompute_sdp_enabled() -> bool:
    return _recompute_sdp


@contextlib.contextmanager
def sdp_kernel(enable_recompute: bool = True) -> Iterator[dict]:
    """Within the block, FusedSDPA calls without a recompute_mode use `enable_recompute` (Habana yields {})."""
    previous = recompute_sdp_enabled()
    try:
        enable_recompute_sdp(enable_recompute)
        yield {}
    finally:
        enable_recompute_sdp(previous)


# -- constant-section serialization (the bridge's hpu/__init__.py over runtime_config.cpp) ---------------------------
# On a Gaudi, graphs compiled for inference keep their constant tensors (weights marked const) in "const sections"
# that the runtime can write under `path/<rank>/` (emptied first when `clear_path`, compressed when `use_compression`)
# and drop from device memory. The emulated Gaudi compiles no recipes and keeps every tensor in host memory: the
# settings are kept, as Habana's runtime keeps them, and nothing is written.
_const_section_serialization = ("", False, False)  # (path, clear_path, use_compression): Habana's "off"


def enable_const_section_serialization(path: Any, clear_path: bool, use_compression: bool) -> None:
    """Habana's signature (all three required); `path` is taken as str(path), as the bridge passes it on."""
    global _const_section_serialization
    _const_section_serialization = (str(path), bool(clear_path), bool(use_compression))


def disable_const_section_serialization() -> None:
    global _const_section_serialization
    _const_section_serialization = ("", False, False)


def const_section_serialization_settings() -> tuple[str, bool, bool]:
    """(path, clear_path, use_compression) as last set; path "" means off (emulated Gaudi only: Habana keeps them in
    its C++ runtime)."""
    return _const_section_serialization


# -- legacy tensor types: hthpu.FloatTensor([...]) and the like, as the bridge makes them -----------------------------
def _create_tensor_alias(name: str, dtype: torch.dtype) -> type:
    """A torch.Tensor subclass whose constructor copies its data to a new tensor of `dtype` on `hpu` (like
    torch.tensor); a `device` or `dtype` keyword other than those is refused with Habana's message. As in the bridge's
    hpu/__init__.py, the device keyword is compared with the string "hpu": "hpu:0" and torch.device("hpu") are refused
    too (on a Gaudi as here; the message adds how to write it)."""

    class TypeFabric(torch.Tensor):
        @staticmethod
        def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
            device = kwargs.get("device")
            if device is not None and device != "hpu":
                raise RuntimeError(f"legacy constructor expects device type: hpu but device type: {device} was passed"
                                   f" (Habana's legacy constructors accept only the string device='hpu', not"
                                   f" {device!r}: pass device='hpu' or leave it out)")
            requested = kwargs.get("dtype")
            if requested is not None and requested != dtype:
                raise RuntimeError(f"legacy constructor expects dtype: {dtype} but dtype: {requested} was passed")
            kwargs["device"], kwargs["dtype"] = "hpu", dtype
            return torch.Tensor._make_subclass(cls, torch.tensor(*args, **kwargs))

    TypeFabric.__name__ = TypeFabric.__qualname__ = name
    return TypeFabric


BFloat16Tensor = _create_tensor_alias("BFloat16Tensor", torch.bfloat16)
BoolTensor = _create_tensor_alias("BoolTensor", torch.bool)
ByteTensor = _create_tensor_alias("ByteTensor", torch.uint8)
CharTensor = _create_tensor_alias("CharTensor", torch.int8)
DoubleTensor = _create_tensor_alias("DoubleTensor", torch.float64)
FloatTensor = _create_tensor_alias("FloatTensor", torch.float32)
HalfTensor = _create_tensor_alias("HalfTensor", torch.float16)
IntTensor = _create_tensor_alias("IntTensor", torch.int32)
LongTensor = _create_tensor_alias("LongTensor", torch.int64)
ShortTensor = _create_tensor_alias("ShortTensor", torch.int16)


# -- HPU graphs: in lazy mode only, as in Habana's software (its hpu module imports them only when is_lazy()) --
_GRAPH_NAMES = ("HPUGraph", "ModuleCacher", "graph", "make_graphed_callables", "wrap_in_hpu_graph",
                "wrap_in_hpu_graph_func", "CachedParams", "copy_to", "input_hash")


def __getattr__(name: str) -> Any:
    if name in _GRAPH_NAMES:
        if not is_lazy():
            raise AttributeError(
                f"habana_frameworks.torch.hpu.{name}: HPU graphs run in lazy mode only (as on a Gaudi). Set"
                " PT_HPU_LAZY_MODE=1 before the first use, or in eager mode compile the model instead:"
                " torch.compile(model, backend='hpu_backend')."
            )
        from habana_frameworks.torch.hpu import graphs  # noqa: PLC0415 -- lazy: as Habana's, in lazy mode only

        return getattr(graphs, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _register_as_torch_hpu(module: Any) -> None:
    """`torch.hpu` is this module, as on a Gaudi where it is Habana's (replacing an earlier import of it)."""
    current = getattr(torch, "hpu", None)
    if current is module:
        return
    if current is not None:
        delattr(torch, "hpu")
    torch._register_device_module("hpu", module)



hpu = sys.modules[__name__]  # habana_frameworks.torch.hpu.hpu, as in Habana's package
sys.modules[__name__].__class__ = _EmulatedModule
_register_as_torch_hpu(sys.modules[__name__])
hpu_device.load()

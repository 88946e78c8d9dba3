"""torch.cuda answered by the emulated Gaudi's torch.hpu, call by call as Habana's toolkit maps them.

Behaviour modelled: the toolkit's `torch/cuda/__init__.py`, `memory.py`, `random.py`, `streams.py`, `nvtx.py` and
`amp/grad_scaler.py` (which calls it maps, which it changes, which it turns into a warning and nothing). Written for
the emulated Gaudi; Habana's code is not copied. Only `torch.cuda`'s module attributes are replaced: a name taken with
`from torch.cuda import X` before the import keeps torch's function, as with Habana's toolkit.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import habana_frameworks.torch.hpu as hpu  # the emulated card: what torch.hpu is
import habana_frameworks.torch.hpu.graphs as hpu_graphs
import torch
import torch.cuda.amp
import torch.cuda.memory
import torch.cuda.nccl
import torch.cuda.nvtx
from habana_frameworks.torch.gpu_migration._devices import to_hpu
from habana_frameworks.torch.gpu_migration._log import HPU_MATCH, HPU_MISMATCH, HPU_MODIFIED, LOG
from habana_frameworks.torch.gpu_migration._torch import TYPED_DTYPES


def _log(api_type: str, name: str, new_call: str, args: dict[str, Any] | None = None) -> None:
    LOG.record(api_type, f"torch.cuda.{name}", args, new_call)


# -- the device -------------------------------------------------------------------------------------------------------
def init() -> None:
    _log(HPU_MATCH, "init", "torch.hpu.init()")
    hpu.init()


def is_initialized() -> bool:
    _log(HPU_MATCH, "is_initialized", "torch.hpu.is_initialized()")
    return bool(hpu.is_initialized())


def is_available() -> bool:
    _log(HPU_MATCH, "is_available", "torch.hpu.is_available()")
    return bool(hpu.is_available())


def device_count() -> int:
    # Habana's asks hl-smi's library (pyhlml) for the machine's cards; the emulated machine's are torch.hpu's.
    _log(HPU_MODIFIED, "device_count", "habana_frameworks.torch.gpu_migration.torch.cuda.device_count()")
    return int(hpu.device_count())


def current_device() -> int:
    """As Habana's: the index among HABANA_VISIBLE_MODULES of the card HLS_MODULE_ID names, else the local rank a
    launcher set (LOCAL_RANK, or Open MPI's), else torch.hpu.current_device()."""
    _log(HPU_MODIFIED, "current_device", "habana_frameworks.torch.gpu_migration.torch.cuda.current_device()")
    visible, module_id = os.environ.get("HABANA_VISIBLE_MODULES"), os.environ.get("HLS_MODULE_ID")
    if visible is not None and module_id is not None:
        modules = visible.split(",")
        if module_id not in modules:
            raise ValueError(f"Cannot find module_id HLS_MODULE_ID={module_id} in HABANA_VISIBLE_MODULES={visible}")
        return modules.index(module_id)
    for variable in ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"):
        if variable in os.environ:
            return int(os.environ[variable])
    return int(hpu.current_device())


def set_device(device: Any) -> None:
    target = to_hpu(device)
    _log(HPU_MATCH, "set_device", f"torch.hpu.set_device({target})", {"device": device})
    hpu.set_device(target)


def synchronize(device: Any = None) -> None:
    hpu.synchronize()
    _log(HPU_MATCH, "synchronize", "torch.hpu.synchronize()")


def get_device_name(device: Any = None) -> str:
    # Habana's torch.hpu.get_device_name ignores the index (one card per process; every card is the same kind), so
    # CUDA code naming its local rank's GPU (Lightning: get_device_name(local_rank)) gets the card's name.
    return str(hpu.get_device_name())


def get_device_capability(device: Any = None) -> tuple[int, int]:
    # Habana's answers the newest CUDA capability it knows, so that code gating features on it takes the newest path.
    _log(HPU_MODIFIED, "get_device_capability", "return (9, 0)", {"device": device})
    return (9, 0)


@dataclass
class _CudaDeviceProperties:
    """The fields of torch.cuda's device properties that Habana's toolkit fills in."""

    name: str
    major: int
    minor: int
    multi_processor_count: int
    total_memory: int


def get_device_properties(device: Any = None) -> _CudaDeviceProperties:
    target = to_hpu(device)
    _log(HPU_MODIFIED, "get_device_properties", f"torch.cuda.get_device_properties(device={target})",
         {"device": device})
    major, minor = get_device_capability()
    return _CudaDeviceProperties(name=hpu.get_device_name(), major=major, minor=minor,
                                 multi_processor_count=multiprocessing.cpu_count(),
                                 total_memory=int(hpu.memory_stats()["Limit"]))


def is_bf16_supported(including_emulation: bool = True) -> bool:
    _log(HPU_MATCH, "is_bf16_supported", "torch.hpu.is_bf16_supported()")
    return bool(hpu.is_bf16_supported())


def get_arch_list() -> list[str]:
    _log(HPU_MODIFIED, "get_arch_list", "habana_frameworks.torch.gpu_migration.torch.hpu.get_arch_list()")
    archs = ["50", "52", "53", "60", "61", "62", "70", "72", "75", "80", "86", "87", "89", "90"]
    return [f"{kind}_{arch}" for kind in ("compute", "lto", "sm") for arch in archs]


def cudart() -> None:
    _log(HPU_MODIFIED, "cudart", "return None")


def current_blas_handle() -> int:
    _log(HPU_MODIFIED, "current_blas_handle", "return 0")
    return 0


def ipc_collect() -> None:
    _log(HPU_MODIFIED, "ipc_collect", "Dummy")


# -- memory: the emulated card's own counters, exact to the byte ------------------------------------------------------
def _memory_call(name: str, hpu_name: str) -> Callable[..., Any]:
    def call(device: Any = None) -> Any:
        target = to_hpu(device)
        _log(HPU_MATCH, name, f"torch.hpu.{hpu_name}(device={target})", {"device": device})
        return getattr(hpu, hpu_name)(target)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"torch.cuda.{name} on the emulated Gaudi: torch.hpu.{hpu_name}."
    return call


_MEMORY_CALLS = {
    "memory_allocated": "memory_allocated", "max_memory_allocated": "max_memory_allocated",
    "memory_reserved": "memory_reserved", "max_memory_reserved": "max_memory_reserved",
    "memory_cached": "memory_reserved", "max_memory_cached": "max_memory_reserved",
    "memory_summary": "memory_summary", "mem_get_info": "mem_get_info", "memory_usage": "memory_usage",
    "reset_peak_memory_stats": "reset_peak_memory_stats", "reset_max_memory_allocated": "reset_peak_memory_stats",
}


# CUDA's caching-allocator names for the card's own counters: CUDA code reads these keys (Lightning's CUDA device
# stats, `memory_stats()["allocated_bytes.all.current"]`). Habana's toolkit returns torch.hpu.memory_stats as it is
# (Gaudi's ten counters only, so such code fails with a KeyError on a Gaudi); here the same dict also carries the CUDA
# name of each counter that has one, with the same value. Names with no Gaudi counter (segments, splits, inactive
# blocks, retries) are left out rather than made up.
_CUDA_STAT_NAMES = {
    "allocated_bytes.all.current": "InUse", "allocated_bytes.all.peak": "MaxInUse",
    "active_bytes.all.current": "InUse", "active_bytes.all.peak": "MaxInUse",
    "reserved_bytes.all.current": "Limit", "reserved_bytes.all.peak": "Limit",
    "allocation.all.current": "ActiveAllocs", "allocation.all.allocated": "NumAllocs",
    "allocation.all.freed": "NumFrees",
}


def memory_stats(device: Any = None) -> dict[str, int]:
    target = to_hpu(device)
    _log(HPU_MATCH, "memory_stats", f"torch.hpu.memory_stats(device={target})", {"device": device})
    stats = dict(hpu.memory_stats(target))
    stats.update({cuda_name: stats[hpu_name] for cuda_name, hpu_name in _CUDA_STAT_NAMES.items() if hpu_name in stats})
    return stats


def _inactive(name: str, why: str) -> Callable[..., None]:
    """A call with no Gaudi equivalent: as Habana's, it warns and does nothing."""

    def call(*args: Any, **kwargs: Any) -> None:
        _log(HPU_MISMATCH, name, "Dummy")
        warnings.warn(why, stacklevel=2)

    call.__name__ = call.__qualname__ = name
    return call


_INACTIVE_CALLS = {
    "empty_cache": "No need to call empty_cache on HPU. It manages the memory internally in an efficient way.",
    "memory_snapshot": "memory_snapshot is not supported on HPU.",
    "set_per_process_memory_fraction": "set_per_process_memory_fraction is not supported on HPU.",
    "reset_max_memory_cached": "reset_max_memory_cached is not supported on HPU. The memory cache size is constant"
    " on HPU.",
    "caching_allocator_alloc": "caching_allocator_alloc is not supported on HPU.",
    "caching_allocator_delete": "caching_allocator_delete is not supported on HPU.",
    # Not in the toolkit read; torch's would call its CUDA library (AttributeError on torch._C._cuda_*). Gaudi has no
    # CUDA allocator to name, and no allocation history to record (memory_snapshot is inactive in the toolkit too).
    "get_allocator_backend": "get_allocator_backend is not supported on HPU: its memory is managed by Habana's own"
    " allocator, neither of CUDA's (native, cudaMallocAsync).",
}
_INACTIVE_MEMORY_CALLS = {  # torch.cuda.memory's, which code calls by that path
    "_record_memory_history": "_record_memory_history is not supported on HPU: no allocation history is recorded"
    " (torch.hpu.memory_stats() gives the card's counters).",
    "_dump_snapshot": "_dump_snapshot is not supported on HPU: no allocation history was recorded; nothing is written.",
}


# -- what CUDA reads from NVIDIA's management library (nvml) ----------------------------------------------------------
def utilization(device: Any = None) -> int:
    """As Habana's toolkit: torch.hpu.utilization, which reads hl-smi's library (never nvidia-ml-py)."""
    target = to_hpu(device)
    _log(HPU_MATCH, "utilization", f"torch.hpu.utilization(device={target})", {"device": device})
    return int(hpu.utilization(target))


def _no_gaudi_equivalent(name: str, what: str) -> Callable[..., Any]:
    """A call the toolkit leaves to torch, whose answer comes from NVIDIA's management library: on a Gaudi it would
    send the user to nvidia-ml-py. It says instead that Gaudi has no such call."""

    def call(device: Any = None) -> Any:
        raise NotImplementedError(
            f"torch.cuda.{name}() has no Gaudi equivalent: it reads {what} from NVIDIA's management library (nvml),"
            " and neither torch.hpu nor Habana's GPU Migration Toolkit offers such a call. On a Gaudi, hl-smi shows"
            " the card's figures; the emulated Gaudi has none to report.")

    call.__name__ = call.__qualname__ = name
    return call


_NO_GAUDI_EQUIVALENT = {"temperature": "the GPU's temperature", "power_draw": "the GPU's power draw",
                        "clock_rate": "the GPU's SM clock"}


# -- torch.cuda.nccl: Gaudi's collectives library is HCCL ------------------------------------------------------------
def nccl_version() -> tuple[int, int, int]:
    """As Habana's toolkit: a fixed NCCL version, (2, 16, 5), for CUDA code gating features on it (HCCL serves
    NCCL's calls here; torch's would ask its NCCL binding, which a build for Gaudi lacks)."""
    LOG.record(HPU_MATCH, "torch.cuda.nccl.version", None, "Dummy")
    return (2, 16, 5)


def set_sync_debug_mode(debug_mode: int | str) -> None:
    _log(HPU_MATCH, "set_sync_debug_mode", f"torch.hpu.set_sync_debug_mode({debug_mode})",
         {"debug_mode": debug_mode})
    hpu.set_sync_debug_mode(debug_mode)


def get_sync_debug_mode() -> int:
    _log(HPU_MODIFIED, "get_sync_debug_mode", "habana_frameworks.torch.gpu_migration.torch.cuda.get_sync_debug_mode()")
    return int(hpu.get_sync_debug_mode())


def can_device_access_peer(device: Any, peer_device: Any) -> bool:
    target, peer = to_hpu(device), to_hpu(peer_device)
    _log(HPU_MATCH, "can_device_access_peer", f"torch.hpu.can_device_access_peer({target}, {peer})",
         {"device": device, "peer_device": peer_device})
    return bool(hpu.can_device_access_peer(target, peer))


def list_gpu_processes(device: Any = None) -> str:
    _log(HPU_MODIFIED, "list_gpu_processes",
         f"habana_frameworks.torch.gpu_migration.torch.hpu.list_gpu_processes(device={to_hpu(device)})",
         {"device": device})
    used = hpu.memory_reserved()
    return f"HPU:{hpu.current_device()}\nprocess {os.getpid()} uses {used / 1024 / 1024:.3f} MB HPU memory"


# -- random numbers: the hpu generator --------------------------------------------------------------------------------
_seeding = threading.local()


def _random_call(name: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        if getattr(_seeding, "active", False):
            # The emulated card draws from the CPU generator: seeding it (torch.hpu.random.manual_seed_all calls
            # torch.manual_seed, which calls torch.cuda.manual_seed_all again) is already under way.
            return None
        shown = ", ".join([*(repr(a) if isinstance(a, str) else str(a) for a in args),
                           *(f"{k}={v}" for k, v in kwargs.items())])
        named = dict(zip(("seed",), args, strict=False)) if name.startswith("manual_seed") else None
        _log(HPU_MATCH, name, f"torch.hpu.random.{name}({shown})", named)
        _seeding.active = "seed" in name
        try:
            return getattr(hpu.random, name)(*args, **kwargs)
        finally:
            _seeding.active = False

    call.__name__ = call.__qualname__ = name
    return call


_RANDOM_CALLS = ("manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state",
                 "set_rng_state", "get_rng_state_all", "set_rng_state_all")


# -- streams and events: the emulated card runs eagerly and in order --------------------------------------------------
def current_stream(device: Any = None) -> Any:
    _log(HPU_MATCH, "current_stream", "torch.hpu.current_stream")
    return hpu.current_stream()


def default_stream(device: Any = None) -> Any:
    _log(HPU_MATCH, "default_stream", "torch.hpu.default_stream")
    return hpu.default_stream()


def set_stream(stream: Any) -> None:
    _log(HPU_MATCH, "set_stream", f"torch.hpu.set_stream({stream})", {"stream": stream})
    hpu.set_stream(stream)


def stream(stream: Any) -> Any:
    _log(HPU_MATCH, "stream", f"torch.hpu.stream({stream})", {"stream": stream})
    return hpu.stream(stream)


# -- CUDA graphs: HPU graphs (on the emulated Gaudi: recorded, run eagerly) ------------------------------------------
def is_current_stream_capturing() -> bool:
    """False: the emulated card has no stream capture (torch asks this when it compiles, whenever CUDA seems to be
    available: with the toolkit on a CUDA build of torch, torch's own answer would need a CUDA driver)."""
    _log(HPU_MATCH, "is_current_stream_capturing", "torch.hpu.is_current_stream_capturing()")
    return False


def graph(cuda_graph: Any, pool: Any = None, stream: Any = None, capture_error_mode: str = "global") -> Any:
    _log(HPU_MATCH, "graph", f"torch.hpu.graph({cuda_graph}, pool={pool}, stream={stream})")
    return hpu_graphs.graph(cuda_graph, stream=stream)


def make_graphed_callables(callables: Any, sample_args: Any, num_warmup_iters: int = 3,
                           allow_unused_input: bool = False, pool: Any = None) -> Any:
    _log(HPU_MATCH, "make_graphed_callables",
         f"torch.hpu.make_graphed_callables({callables}, {sample_args}, num_warmup_iters={num_warmup_iters})")
    return hpu_graphs.make_graphed_callables(callables, sample_args, num_warmup_iters, allow_unused_input)


def graph_pool_handle() -> None:
    _log(HPU_MISMATCH, "graph_pool_handle", "Dummy")


# -- nvtx: profiler ranges, which mean nothing on a Gaudi (Habana's toolkit makes them inactive) ----------------------
def _no_op(*args: Any, **kwargs: Any) -> int:
    return 0


@contextmanager
def _no_range(*args: Any, **kwargs: Any) -> Iterator[None]:
    yield


# -- amp: GradScaler guards fp16 gradients against underflow; Gaudi trains in bf16 ------------------------------------
def _grad_scaler_methods() -> dict[str, Any]:
    """torch.amp.GradScaler's __init__ and state_dict, for a scaler of CUDA's gradients disabled as Habana's toolkit
    disables torch.cuda.amp.GradScaler: `scale` returns the loss as it is, `step` steps the optimizer, `update` does
    nothing (bf16 has fp32's range: no loss scaling needed; and the bridge has no HPU kernel for the fused unscale /
    update ops torch's scaler runs). The toolkit read (for torch 2.3 / 2.4) replaces torch.cuda.amp.GradScaler; since
    torch 2.3 that class is only a deprecated alias of torch.amp.GradScaler("cuda"), so the rule sits here, where both
    spellings (and torch.amp.GradScaler(), whose default device is cuda) reach it. A scaler for another device is
    torch's."""
    original_init = torch.amp.GradScaler.__init__
    original_state_dict = torch.amp.GradScaler.state_dict

    def __init__(self: torch.amp.GradScaler, device: str = "cuda", init_scale: float = 2.0**16,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True) -> None:
        self.disabled_on_hpu = bool(enabled) and str(device).startswith("cuda")
        self.migrated_as = "torch.cuda.amp.GradScaler" if isinstance(self, torch.cuda.amp.GradScaler) else (
            "torch.amp.GradScaler")  # the spelling the log names
        if self.disabled_on_hpu:
            args = {"device": device, "init_scale": init_scale, "growth_factor": growth_factor,
                    "backoff_factor": backoff_factor, "growth_interval": growth_interval, "enabled": enabled}
            if self.migrated_as == "torch.cuda.amp.GradScaler":
                del args["device"]  # not an argument of that spelling
            # as Habana's toolkit logs it (Model-References' gpu_migration logs): hpu_match, and its spelling
            LOG.record(HPU_MATCH, f"{self.migrated_as}.__init__", args, "set enabled to Flase")
            enabled = False
        original_init(self, device, init_scale, growth_factor, backoff_factor, growth_interval, enabled)

    def state_dict(self: torch.amp.GradScaler) -> dict[str, Any]:
        if not getattr(self, "disabled_on_hpu", False):
            return dict(original_state_dict(self))
        warnings.warn("GradScaler is not applicable to HPU. If this instance if disabled, the states of the scaler"
                      " are values in disable mode.", stacklevel=2)
        LOG.record(HPU_MATCH, f"{self.migrated_as}.state_dict", None, "return state in diable mode")
        return {"scale": self.get_scale(), "growth_factor": None, "backoff_factor": None, "growth_interval": None,
                "_growth_tracker": self._get_growth_tracker()}

    return {"__init__": __init__, "state_dict": state_dict}


class GradScaler(torch.cuda.amp.GradScaler):
    """torch.cuda.amp.GradScaler, as the toolkit's: torch.amp.GradScaler("cuda", ...) (disabled above), entered
    directly so that the log names the user's line (torch's alias would be the caller) and torch's deprecation of
    the alias is not the user's warning on the Gaudi."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True) -> None:
        torch.amp.GradScaler.__init__(self, "cuda", init_scale, growth_factor, backoff_factor, growth_interval,
                                      enabled)


# -- torch.cuda's typed tensors: constructors of tensors on the card ------------------------------------------------
def _typed_tensor(name: str, dtype: torch.dtype) -> type:
    """torch.cuda.<name>(...) as Habana's toolkit has it: torch.<name>(...) moved to hpu. It is no longer a tensor
    type (isinstance against it is False); Tensor.type() takes it. (Habana's DoubleTensor builds a float32 tensor;
    this one builds float64, as CUDA's does.)"""

    def __new__(cls: type, *args: Any, **kwargs: Any) -> torch.Tensor:
        LOG.record(HPU_MODIFIED, "torch.cuda.__new__", {"args": args, "kwargs": kwargs},  # Habana's log names no type
                   f"torch.{name}(args={args}, kwargs={{}}).to(hpu)")
        return getattr(torch, name)(*args, **kwargs).to("hpu")

    return type(name, (), {"__new__": __new__, "tensor_type": dtype, "__module__": "torch.cuda",
                           "__doc__": f"torch.cuda.{name}: a {dtype} tensor on hpu (GPU migration)."})


def install(replace: Callable[[Any, str, Any], None]) -> None:
    cuda = torch.cuda
    for function in (init, is_initialized, is_available, device_count, current_device, set_device, synchronize,
                     get_device_name, get_device_capability, get_device_properties, is_bf16_supported, get_arch_list,
                     cudart, current_blas_handle, ipc_collect, list_gpu_processes, current_stream, default_stream,
                     set_stream, stream, is_current_stream_capturing, graph, make_graphed_callables,
                     graph_pool_handle, memory_stats, utilization, set_sync_debug_mode, get_sync_debug_mode,
                     can_device_access_peer):
        replace(cuda, function.__name__, function)
    for name, what in _NO_GAUDI_EQUIVALENT.items():
        replace(cuda, name, _no_gaudi_equivalent(name, what))
    replace(torch.cuda.nccl, "version", nccl_version)
    for name, why in _INACTIVE_MEMORY_CALLS.items():
        replace(torch.cuda.memory, name, _inactive(f"memory.{name}", why))
    for name, hpu_name in _MEMORY_CALLS.items():
        replace(cuda, name, _memory_call(name, hpu_name))
    for name, why in _INACTIVE_CALLS.items():
        replace(cuda, name, _inactive(name, why))
    for name in _RANDOM_CALLS:
        replace(cuda, name, _random_call(name))
    for name in ("Stream", "Event", "device", "device_of"):
        replace(cuda, name, getattr(hpu, name))
    replace(cuda, "CUDAGraph", hpu_graphs.HPUGraph)
    for name in ("range_push", "range_pop", "range_start", "range_end", "mark"):
        replace(torch.cuda.nvtx, name, _no_op)
    replace(torch.cuda.nvtx, "range", _no_range)
    for name, method in _grad_scaler_methods().items():
        replace(torch.amp.GradScaler, name, method)
    replace(torch.cuda.amp, "GradScaler", GradScaler)
    for name, dtype in TYPED_DTYPES.items():
        replace(cuda, name, _typed_tensor(name, dtype))

"""Measured memory of the emulated Gaudi: exact accounting of the tensor storage held on the device.

A tensor is on the emulated device when an ATen op created it inside `DeviceMemory.tracking()` (forward,
backward, optimizer step: activations, gradients, optimizer state) or when it was moved there explicitly
(`track`: parameters, buffers, batches). Each storage is counted once, however many views share it, and is
uncounted by a finalizer the moment torch frees it. The cost is one Python call per ATen op while tracking.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hpu_nb.runtime.base import HPUOutOfMemoryError
from hpu_nb.runtime.env import format_bytes


class DeviceMemory:
    """Counters with the meaning of Gaudi's memory_stats, measured on the CPU.

    The emulation has no pool allocator, so the system counters equal the allocation counters.
    """

    def __init__(self, limit: int, device_label: str = "emulated Gaudi") -> None:
        self.limit = int(limit)
        self.device_label = device_label
        self.in_use = 0
        self.max_in_use = 0
        self.num_allocs = 0
        self.num_frees = 0
        self.max_alloc_size = 0
        self._live: dict[int, _StorageRef] = {}
        self._mode = _TrackingMode(self)
        self._depth = threading.local()

    # -- accounting ---------------------------------------------------------------------------------------
    def track(self, tensor: torch.Tensor) -> None:
        """Count the storage behind `tensor` (once), and uncount it when torch frees it."""
        if tensor.device.type != "cpu" or tensor.is_meta:
            return
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse / nested / functional wrappers have no storage
            return
        key = storage._cdata
        if key in self._live:
            return
        size = storage.nbytes()
        if size == 0:
            return
        if self.in_use + size > self.limit:
            raise HPUOutOfMemoryError(
                f"HPU out of memory on the {self.device_label}: tried to allocate {format_bytes(size)}"
                f" ({size} bytes) with {format_bytes(self.in_use)} already in use; the Limit is"
                f" {format_bytes(self.limit)} ({self.limit} bytes)."
            )
        # A weak reference with a callback is the cheapest way to learn that torch freed the storage.
        self._live[key] = _StorageRef(storage, self._release, key, size)
        self.in_use += size
        self.num_allocs += 1
        if self.in_use > self.max_in_use:
            self.max_in_use = self.in_use
        if size > self.max_alloc_size:
            self.max_alloc_size = size

    def _release(self, ref: "_StorageRef") -> None:
        if self._live.pop(ref.key, None) is not None:
            self.in_use -= ref.size
            self.num_frees += 1

    def track_all(self, obj: Any) -> None:
        from hpu_nb.runtime.base import iter_tensors

        for tensor in iter_tensors(obj):
            self.track(tensor)

    @contextlib.contextmanager
    def tracking(self) -> Iterator[None]:
        """Count every tensor created by ATen ops inside this block (re-entrant)."""
        depth = getattr(self._depth, "value", 0)
        if depth:
            self._depth.value = depth + 1
            try:
                yield
            finally:
                self._depth.value = depth
            return
        self._depth.value = 1
        try:
            with self._mode:
                yield
        finally:
            self._depth.value = 0

    # -- Gaudi's view ----------------------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        active = self.num_allocs - self.num_frees
        return {
            "Limit": self.limit,
            "InUse": self.in_use,
            "MaxInUse": self.max_in_use,
            "NumAllocs": self.num_allocs,
            "NumFrees": self.num_frees,
            "ActiveAllocs": active,
            "MaxAllocSize": self.max_alloc_size,
            "TotalSystemAllocs": self.num_allocs,
            "TotalSystemFrees": self.num_frees,
            "TotalActiveAllocs": active,
        }

    def reset_peak(self) -> None:
        self.max_in_use = self.in_use
        self.max_alloc_size = 0


class _StorageRef(weakref.ref):
    """Weak reference to a counted storage that remembers what to uncount."""

    __slots__ = ("key", "size")

    def __new__(cls, storage: Any, callback: Any, key: int, size: int) -> "_StorageRef":
        self = super().__new__(cls, storage, callback)
        self.key = key
        self.size = size
        return self

    def __init__(self, storage: Any, callback: Any, key: int, size: int) -> None:
        super().__init__(storage, callback)


# op -> whether its outputs can be new storage (False for views, in-place and out= ops, whose outputs alias inputs)
_ALLOCATES: dict[Any, bool] = {}


class _TrackingMode(TorchDispatchMode):
    """Sees every ATen op (forward, autograd's backward, optimizer) and counts the storage it creates."""

    def __init__(self, memory: DeviceMemory) -> None:
        super().__init__()
        self._memory = memory

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        allocates = _ALLOCATES.get(func)
        if allocates is None:
            allocates = _ALLOCATES[func] = not any(ret.alias_info is not None for ret in func._schema.returns)
        if not allocates:
            return out
        track = self._memory.track
        if type(out) is torch.Tensor or isinstance(out, torch.Tensor):
            track(out)
        elif isinstance(out, (tuple, list)):
            for item in out:
                if isinstance(item, torch.Tensor):
                    track(item)
                elif isinstance(item, (tuple, list)):  # _foreach ops return lists of tensors
                    for inner in item:
                        if isinstance(inner, torch.Tensor):
                            track(inner)
        return out

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
        self._live: dict[int, int] = {}
        self._lock = threading.Lock()
        self._mode = _TrackingMode(self)
        self._depth = threading.local()

    # -- accounting ---------------------------------------------------------------------------------------
    def track(self, tensor: torch.Tensor) -> None:
        """Count the storage behind `tensor` (once), and uncount it when torch frees it."""
        if tensor.is_meta or tensor.device.type != "cpu":
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
        with self._lock:
            if key in self._live:
                return
            if self.in_use + size > self.limit:
                raise HPUOutOfMemoryError(
                    f"HPU out of memory on the {self.device_label}: tried to allocate {format_bytes(size)}"
                    f" ({size} bytes) with {format_bytes(self.in_use)} already in use; the Limit is"
                    f" {format_bytes(self.limit)} ({self.limit} bytes)."
                )
            self._live[key] = size
            self.in_use += size
            self.num_allocs += 1
            if self.in_use > self.max_in_use:
                self.max_in_use = self.in_use
            if size > self.max_alloc_size:
                self.max_alloc_size = size
        weakref.finalize(storage, self._release, key, size)

    def _release(self, key: int, size: int) -> None:
        with self._lock:
            if self._live.pop(key, None) is not None:
                self.in_use -= size
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
        with self._lock:
            self.max_in_use = self.in_use
            self.max_alloc_size = 0


class _TrackingMode(TorchDispatchMode):
    """Sees every ATen op (forward, autograd's backward, optimizer) and counts the storage it creates."""

    def __init__(self, memory: DeviceMemory) -> None:
        super().__init__()
        self._memory = memory

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
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

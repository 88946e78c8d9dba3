"""The one interface between hpu_nb and a device: everything above runtime/ talks to a DeviceBackend."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from hpu_nb.runtime.generations import Generation

MEMORY_STAT_KEYS = (
    "Limit",
    "InUse",
    "MaxInUse",
    "NumAllocs",
    "NumFrees",
    "ActiveAllocs",
    "MaxAllocSize",
    "TotalSystemAllocs",
    "TotalSystemFrees",
    "TotalActiveAllocs",
)


class HPUNotAvailableError(RuntimeError):
    """A Gaudi was asked for (HPU_NB_BACKEND=gaudi) but none can be used."""


class HPUOutOfMemoryError(RuntimeError):
    """The device cannot hold what was asked of it (raised by the emulated Gaudi like a real device would)."""


@dataclass
class DeviceFacts:
    """What is known about one card, for %hpu_info and widgets."""

    index: int
    name: str
    memory_total: int | None = None
    memory_used: int | None = None
    memory_peak: int | None = None  # known only for the card this process drives
    utilization: float | None = None  # percent
    temperature: float | None = None  # Celsius
    power: float | None = None  # Watts
    source: str = "runtime"  # where the figures came from: "hl-smi", "pyhlml", "runtime", "emulated"


@dataclass
class Versions:
    torch: str | None = None
    lightning: str | None = None
    habana_frameworks: str | None = None
    synapseai: str | None = None
    firmware: str | None = None
    driver: str | None = None
    extra: dict[str, str] = field(default_factory=dict)


class DeviceBackend(ABC):
    """A device for Lightning to train on: a real Gaudi or the emulated one."""

    name: str  # "gaudi" or "emulated"
    is_emulated: bool
    autocast_device_type: str  # device_type for torch.autocast: "hpu" or "cpu"
    dist_backend: str  # torch.distributed backend: "hccl" or "gloo"

    @abstractmethod
    def is_available(self) -> bool: ...

    @abstractmethod
    def device_count(self) -> int: ...

    @abstractmethod
    def generation(self) -> Generation: ...

    def device_name(self, index: int = 0) -> str:
        return self.generation().device_name

    @abstractmethod
    def root_device(self, index: int = 0) -> Any:
        """The torch.device Lightning places the model on ("hpu" on a Gaudi, "cpu" when emulated)."""

    @abstractmethod
    def memory_stats(self, index: int = 0) -> dict[str, int]:
        """All ten Gaudi memory counters (MEMORY_STAT_KEYS), in bytes / counts."""

    @abstractmethod
    def reset_peak_memory_stats(self, index: int = 0) -> None: ...

    @abstractmethod
    def mark_step(self) -> None:
        """End the accumulated lazy graph and run it (a no-op outside lazy mode)."""

    @abstractmethod
    def synchronize(self) -> None: ...

    @abstractmethod
    def is_lazy(self) -> bool: ...

    @abstractmethod
    def versions(self) -> Versions: ...

    @abstractmethod
    def device_facts(self, timeout: float = 2.0) -> list[DeviceFacts]:
        """Per-card facts; never raises for a missing or hanging tool, degrades to what is known."""

    # Memory accounting hooks. A real Gaudi accounts by itself, so these do nothing there.
    def on_device(self) -> contextlib.AbstractContextManager[None]:
        """Context in which tensor operations run "on the device" (the emulated Gaudi accounts them)."""
        return contextlib.nullcontext()

    def register_on_device(self, tensors: Iterable[Any]) -> None:
        """Declare tensors as moved onto the device (the emulated Gaudi counts their storage)."""

    def describe(self) -> str:
        """One line saying what this backend is; the emulated one says so plainly."""
        kind = "emulated Gaudi on the CPU" if self.is_emulated else "Intel Gaudi"
        return f"{kind}: {self.device_count()} x {self.device_name()}"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"


def iter_tensors(obj: Any) -> Iterator[Any]:
    """Every torch.Tensor inside nested lists / tuples / dicts."""
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from iter_tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from iter_tensors(value)

"""State of the fake habana_frameworks: its configuration, the call log and each card's memory counters.

Not part of the real package. Tests reach it through tests/fake_habana (install_fake_habana / fake_gaudi).
A subprocess can get the same configuration through HPU_NB_FAKE_HABANA_CONFIG (JSON of FakeConfig fields).
"""

from __future__ import annotations

import functools
import json
import os
import threading
from dataclasses import dataclass, field, fields
from typing import Any, Callable

GiB = 1 << 30
# What memory_stats()["Limit"] reports on each card: a little under the HBM (the runtime keeps some).
DEFAULT_LIMITS = {"GAUDI": 31 * GiB, "GAUDI2": 94 * GiB + 620 * (1 << 20), "GAUDI3": 126 * GiB}
CONFIG_ENV = "HPU_NB_FAKE_HABANA_CONFIG"
METRIC_NAMES = ("graph_compilation", "cpu_fallback", "memory_defragmentation", "recipe_cache")


@dataclass
class FakeConfig:
    """What the fake Gaudi machine looks like."""

    available: bool = True
    device_count: int = 8
    device_name: str = "GAUDI2"
    memory_limit: int | None = None  # None: DEFAULT_LIMITS for the device name
    version: str = "1.17.2.1"  # habana_frameworks.torch.__version__ (plugin release numbering follows SynapseAI)
    import_error: str | None = None  # importing habana_frameworks.torch raises ImportError(import_error)
    current_device: int = 0

    def limit(self) -> int:
        if self.memory_limit is not None:
            return self.memory_limit
        return DEFAULT_LIMITS.get(self.device_name.upper(), 94 * GiB)


@dataclass(frozen=True)
class Call:
    """One call into the fake: `name` is the function's dotted path, e.g. habana_frameworks.torch.core.mark_step."""

    name: str
    args: tuple
    kwargs: dict

    @property
    def short(self) -> str:
        return self.name.rsplit(".", 1)[-1]


class CallLog:
    """Every call made into the fake, in order (thread-safe)."""

    def __init__(self) -> None:
        self._calls: list[Call] = []
        self._lock = threading.Lock()

    def record(self, name: str, args: tuple = (), kwargs: dict | None = None) -> None:
        with self._lock:
            self._calls.append(Call(name, tuple(args), dict(kwargs or {})))

    def all(self) -> list[Call]:
        with self._lock:
            return list(self._calls)

    def named(self, name: str) -> list[Call]:
        """Calls whose dotted name is `name` or ends with `.name` (so "mark_step" or "core.mark_step" match)."""
        return [c for c in self.all() if c.name == name or c.name.endswith("." + name)]

    def count(self, name: str) -> int:
        return len(self.named(name))

    def names(self) -> list[str]:
        return [c.name for c in self.all()]

    def clear(self) -> None:
        with self._lock:
            self._calls.clear()

    def __len__(self) -> int:
        return len(self.all())

    def __repr__(self) -> str:
        return f"<CallLog {len(self)} calls: {', '.join(c.short for c in self.all()[-8:])}>"


class DeviceMemory:
    """Memory counters of one card, with Gaudi's ten keys; allocate()/free() move them like the runtime would."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_use = self.max_in_use = 0
        self.num_allocs = self.num_frees = 0
        self.max_alloc_size = 0
        self.total_system_allocs = self.total_system_frees = 0

    def allocate(self, nbytes: int) -> None:
        if nbytes <= 0:
            raise ValueError(f"allocation size must be positive, got {nbytes}")
        if self.in_use + nbytes > self.limit:
            raise RuntimeError(
                f"FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::{nbytes} ({nbytes / GiB:.2f} GiB); "
                f"in use {self.in_use}, limit {self.limit}"
            )
        self.in_use += nbytes
        self.max_in_use = max(self.max_in_use, self.in_use)
        self.num_allocs += 1
        self.total_system_allocs += 1
        self.max_alloc_size = max(self.max_alloc_size, nbytes)

    def free(self, nbytes: int) -> None:
        if nbytes <= 0 or nbytes > self.in_use or self.active_allocs == 0:
            raise ValueError(f"cannot free {nbytes} bytes: {self.in_use} in use in {self.active_allocs} allocations")
        self.in_use -= nbytes
        self.num_frees += 1
        self.total_system_frees += 1

    @property
    def active_allocs(self) -> int:
        return self.num_allocs - self.num_frees

    def reset_peak(self) -> None:
        self.max_in_use = self.in_use
        self.max_alloc_size = 0

    def stats(self) -> dict[str, int]:
        return {
            "Limit": self.limit,
            "InUse": self.in_use,
            "MaxInUse": self.max_in_use,
            "NumAllocs": self.num_allocs,
            "NumFrees": self.num_frees,
            "ActiveAllocs": self.active_allocs,
            "MaxAllocSize": self.max_alloc_size,
            "TotalSystemAllocs": self.total_system_allocs,
            "TotalSystemFrees": self.total_system_frees,
            "TotalActiveAllocs": self.total_system_allocs - self.total_system_frees,
        }


@dataclass
class FakeState:
    config: FakeConfig = field(default_factory=FakeConfig)
    calls: CallLog = field(default_factory=CallLog)
    memory: dict[int, DeviceMemory] = field(default_factory=dict)
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    originals: dict[str, Any] = field(default_factory=dict)  # what importing the fake replaced in torch

    def card(self, index: int) -> DeviceMemory:
        if index not in self.memory:
            self.memory[index] = DeviceMemory(self.config.limit())
        return self.memory[index]

    def reset(self, config: FakeConfig | None = None) -> None:
        self.config = config or FakeConfig()
        self.calls.clear()
        self.memory.clear()
        self.metrics = {name: {"TotalNumber": 0, "TotalTime": 0} for name in METRIC_NAMES}


STATE = FakeState()
STATE.reset()


def _config_from_env() -> None:
    text = os.environ.get(CONFIG_ENV)
    if text:
        known = {f.name for f in fields(FakeConfig)}
        values = {k: v for k, v in json.loads(text).items() if k in known}
        STATE.reset(FakeConfig(**values))


_config_from_env()


def recorded(fn: Callable) -> Callable:
    """Log every call of `fn` (keeps fn's __module__ / __name__, which real code inspects)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        STATE.calls.record(f"{fn.__module__}.{fn.__qualname__}", args, kwargs)
        return fn(*args, **kwargs)

    return wrapper


def device_index(device: Any = None, optional: bool = True) -> int:
    """None / 'hpu' / 'hpu:1' / torch.device('hpu', 1) / 1 -> a valid card index (like habana's _get_device_index)."""
    if device is None:
        index = STATE.config.current_device
    elif isinstance(device, int):
        index = device
    else:
        text = str(device)
        kind, _, number = text.partition(":")
        if kind != "hpu":
            raise ValueError(f"Expected a hpu device, but got: {text}")
        index = int(number) if number else STATE.config.current_device
    count = STATE.config.device_count if STATE.config.available else 0
    if not 0 <= index < count:
        raise AssertionError(f"Invalid device id {index}: {count} HPU devices are visible")
    return index

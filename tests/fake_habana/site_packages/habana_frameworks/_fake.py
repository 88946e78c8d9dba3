"""State of the fake habana_frameworks: its configuration, the call log, the machine's cards and their acquisition.

Not part of the real package. Tests reach it through tests/fake_habana (install_fake_habana / fake_gaudi).
A subprocess gets the same configuration through HPU_NB_FAKE_HABANA_CONFIG (JSON of FakeConfig fields), and shares
the machine (which process holds which card) through FakeConfig.machine_dir.

Modelled on Habana's bridge source (github:HabanaAI/gaudi-pytorch-bridge, "Publish 1.19.0"): a process acquires one
card the first time it uses the device (`hpu._lazy_init`, backend/synapse_helpers/device.cpp): the card named by
HLS_MODULE_ID, else any free card (HABANA_VISIBLE_MODULES is not consulted then); a card stays acquired until the
process ends; a forked child of a process that acquired a card cannot use it.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

GiB = 1 << 30
# What memory_stats()["Limit"] reports on each card: a little under the HBM (the runtime keeps some).
DEFAULT_LIMITS = {"GAUDI": 31 * GiB, "GAUDI2": 94 * GiB + 620 * (1 << 20), "GAUDI3": 126 * GiB}
CONFIG_ENV = "HPU_NB_FAKE_HABANA_CONFIG"
# Habana's global metrics (hpu/metrics/metrics.py): their tags; recipe_cache only with PT_HPU_ENABLE_CACHE_METRICS.
METRIC_TAGS = {
    "graph_compilation": {"TotalNumber": 0, "TotalTime": 0, "AvgTime": 0},
    "cpu_fallback": {"TotalNumber": 0, "FallbackOps": {}},
    "memory_defragmentation": {"TotalNumber": 0, "TotalSuccessful": 0, "AvgTime": 0, "MaxTime": 0},
    "recipe_cache": {"TotalHit": 0, "RecipeHit": {}, "TotalMiss": 0, "RecipeMiss": {}},
}
SYN_DEVICE_TYPES = {"GAUDI": 1, "GAUDI2": 2, "GAUDI3": 3}  # what utils.experimental._get_device_type() answers


@dataclass
class FakeConfig:
    """What the fake Gaudi machine looks like, and which Gaudi software release is installed on it."""

    available: bool = True
    device_count: int = 8
    device_name: str = "GAUDI2"
    memory_limit: int | None = None  # None: DEFAULT_LIMITS for the device name
    release: str = "1.22.0"  # the habana-torch-plugin distribution's version: decides the defaults below
    import_error: str | None = None  # importing habana_frameworks.torch raises ImportError(import_error)
    current_device: int = 0
    machine_dir: str | None = None  # shared by every process of the test: card locks, acquisition log, dist-info

    def limit(self) -> int:
        if self.memory_limit is not None:
            return self.memory_limit
        return DEFAULT_LIMITS.get(self.device_name.upper(), 94 * GiB)

    @property
    def release_tuple(self) -> tuple[int, int]:
        major, minor = self.release.split(".")[:2]
        return int(major), int(minor)

    @property
    def lazy_by_default(self) -> bool:
        """PT_HPU_LAZY_MODE's default: "1" up to 1.20, "0" (eager + torch.compile) from 1.21."""
        return self.release_tuple < (1, 21)

    @property
    def op_list_envs(self) -> tuple[str, str]:
        """The op-list variables the bridge reads: renamed in 1.19."""
        if self.release_tuple >= (1, 19):
            return "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST", "PT_HPU_AUTOCAST_FP32_OPS_LIST"
        return "LOWER_LIST", "FP32_LIST"

    @property
    def supports_device(self) -> bool:
        """1.22 and newer dropped first-generation Gaudi."""
        return not (self.device_name.upper() == "GAUDI" and self.release_tuple >= (1, 22))


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
    """Memory counters of another card of the machine (what pyhlml / hl-smi report); allocate()/free() move them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_use = 0
        self.allocations = 0

    def allocate(self, nbytes: int) -> None:
        if nbytes <= 0:
            raise ValueError(f"allocation size must be positive, got {nbytes}")
        if self.in_use + nbytes > self.limit:
            raise RuntimeError(f"MODULE:PT_DEVMEM Allocation failed for size::{nbytes} ({nbytes / (1 << 20):.0f})MB")
        self.in_use += nbytes
        self.allocations += 1

    def free(self, nbytes: int) -> None:
        if nbytes <= 0 or nbytes > self.in_use or self.allocations == 0:
            raise ValueError(f"cannot free {nbytes} bytes: {self.in_use} in use in {self.allocations} allocations")
        self.in_use -= nbytes
        self.allocations -= 1


class DeviceAcquireError(RuntimeError):
    """What the bridge raises when synDeviceAcquire* fails (the text follows synapse_helpers/device.cpp)."""


class Machine:
    """The cards of the fake box, shared by all processes of a test through a directory.

    A card is held by an exclusive lock on its file (the kernel drops it when the holding process ends, as the driver
    releases a card); every acquisition is appended to acquisitions.jsonl with the process id.
    """

    def __init__(self, directory: str) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.log_path = self.directory / "acquisitions.jsonl"

    def _try_lock(self, card: int) -> int | None:
        fd = os.open(self.directory / f"card{card}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        return fd

    def holder(self, card: int) -> str:
        try:
            return (self.directory / f"card{card}.lock").read_text() or "?"
        except OSError:
            return "?"

    def acquire(self, device_count: int) -> tuple[int, int]:
        """(card, lock fd) for this process, chosen as Habana's device acquisition chooses."""
        module_id = os.environ.get("HLS_MODULE_ID")
        world_size = int(os.environ.get("WORLD_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE") or 1)
        if device_count < 1:
            raise DeviceAcquireError("Device acquire failed. No devices found.")
        fallback = "HABANA_VISIBLE_MODULES" not in os.environ and device_count >= world_size
        if module_id is not None:
            card = int(module_id)
            fd = self._try_lock(card) if 0 <= card < device_count else None
            if fd is not None:
                return self._logged(card, fd, f"by HLS_MODULE_ID={module_id}")
            if not fallback:
                holder = self.holder(card) if 0 <= card < device_count else "no such card"
                raise DeviceAcquireError(
                    f"synStatus=8 [Device already acquired] Device acquire failed. (HLS_MODULE_ID={module_id}: held by"
                    f" process {holder})")
        for card in range(device_count):
            fd = self._try_lock(card)
            if fd is not None:
                return self._logged(card, fd, "by device type")
        raise DeviceAcquireError(
            f"synStatus=8 [Device already acquired] Device acquire failed. (all {device_count} cards are held)")

    def _logged(self, card: int, fd: int, how: str) -> tuple[int, int]:
        entry = {"pid": os.getpid(), "ppid": os.getppid(), "card": card, "how": how, "time": time.time()}
        with open(self.log_path, "a", encoding="utf-8") as log:
            log.write(json.dumps(entry) + "\n")
        return card, fd

    def acquisitions(self) -> list[dict[str, Any]]:
        """Every acquisition on this machine, in order: {"pid", "ppid", "card", "how", "time"}."""
        if not self.log_path.exists():
            return []
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line.strip()]


@dataclass
class FakeState:
    config: FakeConfig = field(default_factory=FakeConfig)
    calls: CallLog = field(default_factory=CallLog)
    memory: dict[int, DeviceMemory] = field(default_factory=dict)
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    originals: dict[str, Any] = field(default_factory=dict)  # what importing the fake replaced in torch
    machine: Machine | None = None

    def card(self, index: int) -> DeviceMemory:
        if index not in self.memory:
            self.memory[index] = DeviceMemory(self.config.limit())
        return self.memory[index]

    def reset(self, config: FakeConfig | None = None) -> None:
        self.config = config or FakeConfig()
        self.calls.clear()
        self.memory.clear()
        self.metrics = {name: json.loads(json.dumps(tags)) for name, tags in METRIC_TAGS.items()}
        self.machine = Machine(self.config.machine_dir) if self.config.machine_dir else None


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


def device_index(device: Any = None) -> int:
    """None / 'hpu' / 'hpu:1' / torch.device('hpu', 1) / 1 -> a card index checked against device_count()."""
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
        raise AssertionError("Invalid device id")
    return index

"""Everything %hpu_info shows, collected as plain data (no IPython, no Lightning), fast and without exceptions.

Collecting never raises: a failing or hanging device tool degrades to what the runtime knows, and each problem is
kept in `HPUInfo.problems` so the report can say what is missing and why (settings changed after the device started,
which it does not follow, are reported there too). On the emulated backend nothing here starts a subprocess.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from hpu_nb.runtime import get_backend
from hpu_nb.runtime.base import DeviceBackend, DeviceFacts, Versions
from hpu_nb.runtime.env import FLAGS, flag_values


@dataclass
class FlagInfo:
    name: str
    value: str | None  # None when unset
    meaning: str


@dataclass
class HPUInfo:
    backend: str  # "gaudi" / "emulated"
    is_emulated: bool
    description: str  # one line, says "emulated Gaudi" plainly when it is
    generation: str  # "gaudi2"
    device_name: str  # "GAUDI2"
    device_count: int
    hbm_bytes: int
    lazy_mode: bool  # the mode in force (Habana's is_lazy(): PT_HPU_LAZY_MODE, else the release's default)
    fp16: tuple[bool, str]
    fp8: tuple[bool, str]
    autocast_device_type: str
    dist_backend: str
    devices: list[DeviceFacts] = field(default_factory=list)
    versions: Versions = field(default_factory=Versions)
    flags: list[FlagInfo] = field(default_factory=list)
    # Habana's global metrics {name: {tag: value}}: graph_compilation (TotalNumber, TotalTime in us, AvgTime; on the
    # emulated Gaudi torch.compile's hpu_backend, plus Recompilations), recipe_cache (TotalHit, TotalMiss; with
    # PT_HPU_ENABLE_CACHE_METRICS=1 on a Gaudi), cpu_fallback, memory_defragmentation.
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    dynamic_shapes: bool | None = None  # Habana's dynamic-shape switch (None: unknown)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0  # how long collecting took
    release: str | None = None  # the Gaudi software release whose behaviour is in force ("1.21")
    compile_backend: str = "hpu_backend"  # torch.compile(model, backend=...) in eager mode

    @property
    def flags_set(self) -> list[FlagInfo]:
        return [flag for flag in self.flags if flag.value is not None]


def _process_memory(backend: DeviceBackend, problems: list[str]) -> dict[str, int] | None:
    """Memory counters of the card this process drives, when it holds one: asking Habana for them would acquire a
    card, and a kernel holding a card can no longer fork multi-card workers."""
    try:
        if not backend.device_acquired():
            return None
        return backend.memory_stats(0)
    except Exception as err:
        problems.append(f"memory_stats failed: {type(err).__name__}: {err}")
        return None


def collect_info(backend: DeviceBackend | None = None, timeout: float = 2.0) -> HPUInfo:
    """Gather what %hpu_info shows. Never raises for device problems; `timeout` bounds hl-smi / pyhlml."""
    start = time.perf_counter()
    problems: list[str] = []
    if backend is None:
        backend = get_backend()
    gen = backend.generation()
    try:
        count = backend.device_count()
    except Exception as err:
        problems.append(f"device_count failed: {type(err).__name__}: {err}")
        count = 0
    try:
        facts: list[DeviceFacts] = list(backend.device_facts(timeout))
    except Exception as err:
        problems.append(f"device facts unavailable: {type(err).__name__}: {err}")
        facts = [DeviceFacts(index=i, name=gen.device_name, memory_total=gen.hbm_bytes) for i in range(count)]
    try:
        versions = backend.versions()
    except Exception as err:
        problems.append(f"versions unavailable: {type(err).__name__}: {err}")
        versions = Versions()
    stats = _process_memory(backend, problems)
    problems += backend.settings_not_in_force()
    devices = []
    for fact in facts:
        if fact.index == 0 and stats is not None:  # the card this process drives: its counters beat the tool's
            fact = dataclasses.replace(
                fact,
                memory_used=stats.get("InUse", fact.memory_used),
                memory_peak=stats.get("MaxInUse"),
                memory_total=stats.get("Limit", fact.memory_total),
            )
        devices.append(fact)
    try:
        release = backend.release()
    except Exception as err:
        problems.append(f"release unknown: {type(err).__name__}: {err}")
        release = None
    try:
        lazy = backend.is_lazy()
    except Exception as err:
        problems.append(f"is_lazy failed: {type(err).__name__}: {err}")
        lazy = release.lazy_by_default if release is not None else False
    values = flag_values()
    try:
        metrics, dynamic_shapes = backend.metrics(), backend.dynamic_shapes()
    except Exception as err:
        problems.append(f"metrics unavailable: {type(err).__name__}: {err}")
        metrics, dynamic_shapes = {}, None
    return HPUInfo(
        backend=backend.name,
        is_emulated=backend.is_emulated,
        description=backend.describe() if count else f"{backend.name}: no device",
        generation=gen.key,
        device_name=gen.device_name,
        device_count=count,
        hbm_bytes=gen.hbm_bytes,
        lazy_mode=lazy,
        fp16=gen.fp16_support(),
        fp8=gen.fp8_support(),
        autocast_device_type=backend.autocast_device_type,
        dist_backend=backend.dist_backend,
        devices=devices,
        versions=versions,
        flags=[FlagInfo(name, values[name], meaning) for name, meaning in FLAGS.items()],
        metrics=metrics,
        dynamic_shapes=dynamic_shapes,
        problems=problems,
        seconds=time.perf_counter() - start,
        release=str(release) if release is not None else None,
        compile_backend=backend.compile_backend,
    )

"""The one interface between hpu_nb and a device: everything above runtime/ talks to a DeviceBackend."""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from hpu_nb.runtime.env import VISIBLE_MODULES_ENV, lazy_mode_from_env, visible_modules
from hpu_nb.runtime.generations import FP32_LIST_ENV, LOWER_LIST_ENV, Generation, Release

# No torch at the top: the seam is imported before a backend is chosen, and on a Gaudi `import torch` loads Habana's
# software (its autoload), which hpu_nb.runtime._create_backend checks the environment for first.

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


# Habana's global metrics (habana_frameworks.torch.hpu.metrics);
# "recipe_cache" exists with PT_HPU_ENABLE_CACHE_METRICS=1.
METRIC_NAMES = ("graph_compilation", "recipe_cache", "cpu_fallback", "memory_defragmentation")


class HPUNotAvailableError(RuntimeError):
    """A Gaudi was asked for (HPU_NB_BACKEND=gaudi) but none can be used."""


OUT_OF_MEMORY_TEXT = "PT_DEVMEM Allocation failed"  # how Habana's runtime (and the emulated card) reports it


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is a card running out of memory: a RuntimeError whose text has Habana's PT_DEVMEM message."""
    return isinstance(error, RuntimeError) and OUT_OF_MEMORY_TEXT in str(error)


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


def python_stack_versions() -> Versions:
    """The installed torch and Lightning, from their distributions' metadata (nothing is imported); torch's own
    `__version__` where it is imported already: it names the build (2.14.1+cu130 where the metadata says 2.14.1)."""

    def installed(distribution: str) -> str | None:
        try:
            return version(distribution)
        except PackageNotFoundError:
            return None

    imported_torch = getattr(sys.modules.get("torch"), "__version__", None)
    torch_version = str(imported_torch) if imported_torch else installed("torch")
    return Versions(torch=torch_version, lightning=installed("lightning") or installed("pytorch-lightning"))


class DeviceBackend(ABC):
    """A Gaudi for Lightning to train on, real or emulated, driven through Habana's API (`habana_frameworks.torch`).

    Both backends run the same code: tensors on `hpu`, autocast on "hpu", HCCL, `htcore.mark_step()`,
    `hthpu.memory_stats()`. They differ only below that API (Habana's software or hpu_nb's emulated device) and in
    where facts about the machine come from (hl-smi / habana-pyhlml, or the emulation's configuration).
    """

    name: str  # "gaudi" or "emulated"
    is_emulated: bool
    autocast_device_type = "hpu"  # device_type for torch.autocast
    dist_backend = "hccl"  # torch.distributed backend
    compile_backend = "hpu_backend"  # torch.compile(model, backend=...) in eager mode

    def __init__(self, htcore: Any, hthpu: Any) -> None:
        self._htcore = htcore  # habana_frameworks.torch.core
        self._hthpu = hthpu  # habana_frameworks.torch.hpu

    # -- facts about the machine (differ by backend) -------------------------------------------------------------------
    @abstractmethod
    def is_available(self) -> bool: ...

    @abstractmethod
    def device_count(self) -> int:
        """Cards on this machine, read without acquiring one."""

    def auto_device_count(self) -> int:
        """How many cards devices="auto" means: every card of the machine."""
        return self.device_count()

    @abstractmethod
    def generation(self) -> Generation:
        """The generation of this machine's cards, read without acquiring one."""

    def device_name(self, index: int = 0) -> str:
        return self.generation().device_name

    def fp16_support(self) -> tuple[bool, str]:
        return self.generation().fp16_support()

    def fp8_support(self) -> tuple[bool, str]:
        return self.generation().fp8_support()

    @abstractmethod
    def release(self) -> Release | None:
        """The Gaudi software release whose behaviour is in force (None when it cannot be told)."""

    def check_mode_setting(self) -> None:
        """Refuse a PT_HPU_LAZY_MODE that is neither "0" nor "1" (ValueError naming it). Habana's core reads it as "0"
        or not, its HCCL module with int(): anything else would mean different modes in different places."""
        release = self.release()
        lazy_mode_from_env(release.lazy_by_default if release is not None else False)

    @abstractmethod
    def versions(self) -> Versions: ...

    # -- torch.compile -----------------------------------------------------------------------------------------------
    @abstractmethod
    def graph_compiler(self) -> Callable[..., Any]:
        """The function torch.compile(backend="hpu_backend") runs with this device's software."""

    # -- fp8 ---------------------------------------------------------------------------------------------------------
    @abstractmethod
    def fp8_engine(self) -> Any:
        """The fp8 engine of this device's software (hpu_nb.runtime.fp8.Fp8Engine), one per backend."""

    # -- autocast op lists -------------------------------------------------------------------------------------------
    def op_list_envs(self) -> tuple[str, str]:
        """The (lower-precision, fp32) op-list variables the software in force reads (renamed in 1.19)."""
        release = self.release()
        return release.op_list_envs if release is not None else (LOWER_LIST_ENV, FP32_LIST_ENV)

    @abstractmethod
    def load_autocast_lists(self) -> tuple[bool, str]:
        """Have the device use the op-list files its variables name now: (in force in this process, note)."""

    @abstractmethod
    def device_facts(self, timeout: float = 2.0) -> list[DeviceFacts]:
        """Per-card facts; never raises for a missing or hanging tool, degrades to what is known."""

    # -- the device, through Habana's API (the same on both backends) --------------------------------------------------
    def device_acquired(self) -> bool:
        """Whether this process holds its card (Habana acquires one on first use: a tensor, the name, memory)."""
        return bool(self._hthpu.is_initialized())

    def can_fork_workers(self) -> tuple[bool, str]:
        """(allowed, reason): a forked worker cannot use a card its parent acquired."""
        if self.device_acquired():
            return False, "this process has already acquired a Gaudi card, which forked workers cannot use"
        return True, ""

    def root_device(self, index: int = 0) -> Any:
        """The torch.device Lightning places the model on: this process's card, hpu:0 (one card per process)."""
        import torch  # noqa: PLC0415 -- lazy: on a Gaudi, import torch loads Habana's software

        return torch.device("hpu", index)

    def memory_stats(self, index: int = 0) -> dict[str, int]:
        """The ten Gaudi memory counters (MEMORY_STAT_KEYS) of this process's card, as ints."""
        raw = self._hthpu.memory_stats(self.root_device(index)) or {}
        return {key: int(raw.get(key, 0)) for key in MEMORY_STAT_KEYS}

    def reset_peak_memory_stats(self, index: int = 0) -> None:
        self._hthpu.reset_peak_memory_stats(self.root_device(index))

    def is_lazy(self) -> bool:
        """Whether Habana's software runs in lazy mode here (it decides: PT_HPU_LAZY_MODE and the release default)."""
        return bool(self._htcore.is_lazy())

    def mark_step(self) -> None:
        """End the accumulated lazy graph and run it; in eager / torch.compile mode there is no graph to end."""
        if self.is_lazy():
            self._htcore.mark_step()

    def synchronize(self) -> None:
        self._hthpu.synchronize()

    def settings_not_in_force(self) -> list[str]:
        """Environment settings changed since the device started, which it does not follow (each said in a sentence)."""
        return []

    def metrics(self, names: tuple[str, ...] = METRIC_NAMES) -> dict[str, dict[str, Any]]:
        """Habana's global metrics as {name: {tag: value}}: graph compilations (on the emulated Gaudi, those of
        torch.compile's hpu_backend, recompilations included), the recipe cache, CPU fallbacks, defragmentation.
        A metric this release does not report is left out."""
        result: dict[str, dict[str, Any]] = {}
        for name in names:
            try:
                metric = self._hthpu.metrics.metric_global(name)
                if metric is not None:
                    result[name] = dict(metric.stats())
            except Exception:
                continue
        return result

    def dynamic_shapes(self) -> bool | None:
        """Habana's dynamic-shape switch (PT_HPU_ENABLE_REFINE_DYNAMIC_SHAPES); None if absent."""
        status = getattr(self._hthpu, "get_dynamic_shape_status", None)
        try:
            return bool(status()) if callable(status) else None
        except Exception:
            return None

    def more_cards_hint(self) -> str:
        """What to do when a job asks for more cards than it may use (appended to the error)."""
        if visible_modules():
            return f" {VISIBLE_MODULES_ENV} lists the cards this job may use: list more there, or ask for fewer."
        return ""

    @property
    def kind(self) -> str:
        """What this backend is, in words: "emulated Gaudi on the CPU" or "Intel Gaudi" (every label says it)."""
        return "emulated Gaudi on the CPU" if self.is_emulated else "Intel Gaudi"

    def device_label(self, index: int = 0) -> str:
        """The device's name, marked when emulated: "GAUDI2 (emulated)" or "GAUDI2"."""
        return self.device_name(index) + (" (emulated)" if self.is_emulated else "")

    # -- what this backend can do (asked instead of "emulated or not?" by the layers above) --------------------------
    @property
    def has_media_engine(self) -> bool:
        """Whether Habana's media loader (habana_dataloader) can run: a Gaudi's media engine; the emulation has none."""
        return not self.is_emulated

    @property
    def records_hpu_activity(self) -> bool:
        """Whether torch's profiler can record an HPU activity (Habana's profiler); the emulation records CPU only."""
        return not self.is_emulated

    def describe(self) -> str:
        """One line saying what this backend is; the emulated one says so plainly."""
        tenant = ",".join(visible_modules())
        return f"{self.kind}: {self.device_count()} x {self.device_name()}" + (
            f" ({VISIBLE_MODULES_ENV}={tenant})" if tenant else "")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"


def iter_tensors(obj: Any) -> Iterator[Any]:
    """Every torch.Tensor inside nested lists / tuples / dicts."""
    import torch  # noqa: PLC0415 -- lazy: on a Gaudi, import torch loads Habana's software

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from iter_tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from iter_tensors(value)

"""The real Gaudi backend: habana_frameworks.torch for the device, hl-smi / habana-pyhlml for facts.

Only this module (with hlml.py) touches habana_frameworks. Device facts and versions are gathered lazily
(first asked, never at import or construction) and cached, because hl-smi is a subprocess that may be
missing or hang; they degrade to what the runtime knows and never raise.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import threading
import time
from typing import Any

from hpu_nb.runtime import hlml, hlsmi
from hpu_nb.runtime.base import DeviceBackend, DeviceFacts, HPUNotAvailableError, Versions
from hpu_nb.runtime.generations import Generation, generation_from_name

log = logging.getLogger(__name__)

CORE_MODULE = "habana_frameworks.torch.core"  # imported first: it registers the hpu device with torch
HPU_MODULE = "habana_frameworks.torch.hpu"
TE_MODULE = "habana_frameworks.torch.hpex.experimental.transformer_engine"
FACTS_TTL_S = 1.0  # live facts younger than this are served from the cache


def _import_runtime() -> tuple[Any, Any]:
    """(htcore, hthpu) of Habana's software: core first, as Habana's docs require, then the hpu module."""
    from hpu_nb.runtime.emulated_habana import is_emulated_module, real_habana_spec

    if real_habana_spec() is None:
        raise ImportError("habana_frameworks is not installed (it ships in Intel's Gaudi images, not on PyPI)")
    htcore = importlib.import_module(CORE_MODULE)
    hthpu = importlib.import_module(HPU_MODULE)
    if is_emulated_module(hthpu):
        raise ImportError("habana_frameworks here is hpu_nb's emulated surface, not Habana's software")
    return htcore, hthpu


def probe_gaudi() -> tuple[bool, str]:
    """(found, reason): whether habana_frameworks imports and sees at least one Gaudi. Never raises."""
    from hpu_nb.runtime.emulated_habana import real_habana_spec

    try:
        if real_habana_spec() is None:
            return False, "habana_frameworks is not installed (it ships in Intel's Gaudi images, not on PyPI)"
    except (ImportError, ValueError) as err:
        return False, f"habana_frameworks cannot be found ({err})"
    try:
        _, hthpu = _import_runtime()
    except Exception as err:
        return False, f"habana_frameworks is installed but does not import ({type(err).__name__}: {err})"
    try:
        available, count = bool(hthpu.is_available()), int(hthpu.device_count())
        name = str(hthpu.get_device_name()) if available and count > 0 else ""
    except Exception as err:
        return False, f"habana_frameworks failed to query the devices ({type(err).__name__}: {err})"
    if not available or count < 1:
        return False, (
            f"habana_frameworks sees no Gaudi (is_available()={available}, device_count()={count}); "
            "check `hl-smi`, the habanalabs driver and HABANA_VISIBLE_MODULES"
        )
    return True, f"{count} x {name}"


class GaudiBackend(DeviceBackend):
    """Intel Gaudi through Habana's habana_frameworks; facts about the machine from habana-pyhlml / hl-smi."""

    name = "gaudi"
    is_emulated = False

    def __init__(self, facts_timeout: float = hlsmi.DEFAULT_TIMEOUT) -> None:
        try:
            super().__init__(*_import_runtime())
        except Exception as err:
            raise HPUNotAvailableError(
                f"The Gaudi backend needs habana_frameworks.torch, which does not import here "
                f"({type(err).__name__}: {err}). Use HPU_NB_BACKEND=emulated to run on the CPU."
            ) from err
        self.facts_timeout = facts_timeout
        self._versions_lock = threading.Lock()  # two locks: a slow hl-smi -v must not hold up live facts
        self._facts_lock = threading.Lock()
        self._generation: Generation | None = None
        self._versions: Versions | None = None
        self._facts: tuple[float, list[DeviceFacts]] | None = None
        self.facts_reasons: dict[str, str] = {}  # source -> why it gave no facts (remembered: not retried)

    # -- facts -----------------------------------------------------------------------------------------------
    def is_available(self) -> bool:
        return bool(self._hthpu.is_available())

    def device_count(self) -> int:
        return int(self._hthpu.device_count())

    def device_name(self, index: int = 0) -> str:
        return str(self._hthpu.get_device_name(index))

    def generation(self) -> Generation:
        if self._generation is None:
            self._generation = generation_from_name(self.device_name())
        return self._generation

    # -- Gaudi-only extras (metrics are DeviceBackend.metrics, the same on both backends) ------------------------
    def transformer_engine(self) -> Any:
        """Habana's transformer engine module (fp8 training: Linear, fp8_autocast, recipe)."""
        return importlib.import_module(TE_MODULE)

    # -- versions and live facts (lazy, cached, never raising) ----------------------------------------------
    def versions(self) -> Versions:
        with self._versions_lock:
            if self._versions is None:
                self._versions = self._read_versions()
            return self._versions

    def _read_versions(self) -> Versions:
        from hpu_nb.runtime.emulated import _versions_of_python_stack

        versions = _versions_of_python_stack()
        versions.habana_frameworks = self._habana_frameworks_version()
        version = hlsmi.read_version(self.facts_timeout)
        if version.ok:
            versions.synapseai, versions.firmware = version.value.synapseai, version.value.firmware
            # -L is only worth asking once -v has answered: a missing or hanging tool is not asked twice.
            listing = hlsmi.read_listing(self.facts_timeout)
            if listing.ok:
                versions.driver = listing.value.driver_version
            else:
                versions.extra["hl-smi -L"] = listing.reason or "unknown"
        else:
            versions.extra["hl-smi"] = version.reason or "unknown"
            if versions.habana_frameworks:  # the plugin's release numbering follows SynapseAI's
                versions.synapseai = ".".join(versions.habana_frameworks.split(".")[:3])
                versions.extra["synapseai from"] = "habana_frameworks version (hl-smi gave none)"
        return versions

    def _habana_frameworks_version(self) -> str | None:
        for name in ("habana_frameworks.torch", "habana_frameworks"):
            version = getattr(importlib.import_module(name), "__version__", None)
            if version:
                return str(version)
        try:
            from importlib.metadata import version as dist_version

            return dist_version("habana-torch-plugin")
        except Exception:
            return None

    def device_facts(self, timeout: float | None = None) -> list[DeviceFacts]:
        """Per-card facts from habana-pyhlml, else `hl-smi -Q`, else the runtime; a failed source is not retried."""
        timeout = self.facts_timeout if timeout is None else timeout
        with self._facts_lock:
            now = time.monotonic()
            if self._facts is not None and now - self._facts[0] < FACTS_TTL_S:
                return list(self._facts[1])
            facts = self._read_facts(timeout)
            self._facts = (time.monotonic(), facts)
            return list(facts)

    def _read_facts(self, timeout: float) -> list[DeviceFacts]:
        for source, read in (("pyhlml", hlml.read_facts), ("hl-smi", hlsmi.read_facts)):
            if source in self.facts_reasons:
                continue
            outcome = read(timeout)
            if outcome.ok and outcome.value:
                return outcome.value
            self.facts_reasons[source] = outcome.reason or "no cards listed"
            log.debug("device facts from %s unavailable: %s", source, self.facts_reasons[source])
        return self._runtime_facts()

    def _runtime_facts(self) -> list[DeviceFacts]:
        """What habana_frameworks itself knows: names for every card, memory for the one this process drives."""
        try:
            count, name = self.device_count(), self.device_name()
        except Exception as err:
            self.facts_reasons["runtime"] = f"{type(err).__name__}: {err}"
            return []
        facts = [DeviceFacts(index=i, name=name, source="runtime") for i in range(count)]
        try:
            current = int(self._hthpu.current_device())
            stats = self.memory_stats(current)
            if 0 <= current < count:
                facts[current].memory_total = stats["Limit"]
                facts[current].memory_used = stats["InUse"]
        except Exception as err:
            self.facts_reasons["runtime memory"] = f"{type(err).__name__}: {err}"
        return facts

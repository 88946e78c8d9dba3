"""The real Gaudi backend: habana_frameworks.torch for the device, hl-smi / habana-pyhlml for facts.

Only this module (with hlml.py and habana_fp8.py) touches habana_frameworks. A process that asks Habana for the
device name, the current device or memory acquires a card (hpu._lazy_init), so everything this backend says about the
machine (generation, name, count, facts) is read without acquiring one: Habana's device type query (which runs before
acquisition, as optimum-habana uses it), habana-pyhlml, `hl-smi`, and `device_count()`. A launcher process that builds
a multi-card Trainer therefore holds no card, and each worker acquires its own. Device facts and versions are gathered
lazily (first asked, never at import or construction) and cached, because hl-smi is a subprocess that may be missing
or hang; they degrade to what is known and never raise.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import threading
import time
import warnings
from collections.abc import Callable
from importlib import metadata
from typing import Any

from hpu_nb.runtime import hlml, hlsmi
from hpu_nb.runtime.base import DeviceBackend, DeviceFacts, HPUNotAvailableError, Versions, python_stack_versions
from hpu_nb.runtime.compile_backend import habanas_for_torch, make_way_for_habana
from hpu_nb.runtime.env import visible_modules
from hpu_nb.runtime.generations import GENERATIONS, Generation, Release, generation_from_name, release_from_version
from hpu_nb.runtime.habana_install import is_emulated, real_habana_spec

log = logging.getLogger(__name__)

CORE_MODULE = "habana_frameworks.torch.core"  # imported first: it registers the hpu device with torch
HPU_MODULE = "habana_frameworks.torch.hpu"
EXPERIMENTAL_MODULE = "habana_frameworks.torch.utils.experimental"  # the device type, before any card is acquired
PLUGIN_DISTRIBUTION = "habana-torch-plugin"  # habana_frameworks.torch has no __version__: its distribution has
FACTS_TTL_S = 1.0  # live facts younger than this are served from the cache


def _import_runtime() -> tuple[Any, Any]:
    """(htcore, hthpu) of Habana's software: core first, as Habana's docs require, then the hpu module."""
    if real_habana_spec() is None:
        raise ImportError("habana_frameworks is not installed (it ships in Intel's Gaudi images, not on PyPI)")
    make_way_for_habana()  # Habana registers "hpu_backend" on import; torch may have registered hpu_nb's meanwhile
    htcore = importlib.import_module(CORE_MODULE)
    hthpu = importlib.import_module(HPU_MODULE)
    if is_emulated(hthpu):
        raise ImportError("habana_frameworks here is hpu_nb's emulated surface, not Habana's software")
    return htcore, hthpu


def probe_gaudi() -> tuple[bool, str]:
    """(found, reason): whether habana_frameworks imports and sees at least one Gaudi. Never raises."""
    try:
        if real_habana_spec() is None:
            return False, "habana_frameworks is not installed (it ships in Intel's Gaudi images, not on PyPI)"
    except (ImportError, ValueError) as err:
        return False, f"habana_frameworks cannot be found ({err})"
    try:
        _, hthpu = _import_runtime()
    except Exception as err:
        return False, f"habana_frameworks is installed but does not import ({type(err).__name__}: {err})"
    try:  # neither call acquires a card (asking the device name would)
        available, count = bool(hthpu.is_available()), int(hthpu.device_count())
    except Exception as err:
        return False, f"habana_frameworks failed to query the devices ({type(err).__name__}: {err})"
    if not available or count < 1:
        return False, (
            f"habana_frameworks sees no Gaudi (is_available()={available}, device_count()={count}); "
            "check `hl-smi`, the habanalabs driver and HABANA_VISIBLE_MODULES"
        )
    generation = _generation_from_device_type()
    release = plugin_release()
    if generation is not None and release is not None:
        supported, reason = release.supports(generation)
        if not supported:
            return False, reason
    return True, f"{count} x {generation.device_name if generation else 'Gaudi'}"


def plugin_release() -> Release | None:
    """The installed Gaudi software release, from the habana-torch-plugin distribution (None when not installed)."""
    version = plugin_version()
    try:
        return release_from_version(version) if version else None
    except ValueError:
        return None


def plugin_version() -> str | None:
    try:
        return metadata.version(PLUGIN_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None


def _generation_from_device_type() -> Generation | None:
    """The generation from Habana's device-type query, which counts devices by type without acquiring one."""
    try:
        htexp = importlib.import_module(EXPERIMENTAL_MODULE)
        device_type = htexp._get_device_type()  # an int or the enum: compared with ==, as Habana's own code does
        return next((gen for gen in GENERATIONS.values()
                     if hasattr(htexp.synDeviceType, gen.syn_device_type)
                     and device_type == getattr(htexp.synDeviceType, gen.syn_device_type)), None)
    except Exception as err:  # an older release without it, or a driver problem: other sources follow
        log.debug("habana device type unavailable: %s", err)
        return None


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
        self.check_mode_setting()
        self.facts_timeout = facts_timeout
        self._versions_lock = threading.Lock()  # two locks: a slow hl-smi -v must not hold up live facts
        self._facts_lock = threading.Lock()
        self._generation: Generation | None = None
        self._versions: Versions | None = None
        self._facts: tuple[float, list[DeviceFacts]] | None = None
        self.facts_reasons: dict[str, str] = {}  # source -> why it gave no facts (remembered: not retried)
        self._fp8: Any = None
        # What Habana read when it loaded (it had, by now): the op-list variables as they are at this point.
        self._op_lists_at_load = {name: os.environ.get(name) for name in self.op_list_envs()}
        self._warn_about_old_op_list_names()

    def _warn_about_old_op_list_names(self) -> None:
        release = self.release()
        if release is None:
            return
        for old, new in release.ignored_op_list_envs(os.environ):
            warnings.warn(f"{old} is not read by Gaudi software {release} (1.19 and newer): name the file in {new}"
                          " instead; the default list is in force.", stacklevel=3)

    def graph_compiler(self) -> Callable[..., Any]:
        """Habana's hpu_backend, which its core registered when this backend imported it."""
        return habanas_for_torch()

    def fp8_engine(self) -> Any:
        """Habana's transformer engine for training, Intel Neural Compressor for inference."""
        if self._fp8 is None:
            from hpu_nb.runtime.habana_fp8 import HabanaFp8Engine  # noqa: PLC0415 -- lazy: imports torch: fp8 only

            self._fp8 = HabanaFp8Engine()
        return self._fp8

    def load_autocast_lists(self) -> tuple[bool, str]:
        """Habana read the op-list files when it loaded: they are in force only if the variables still say so."""
        now = {name: os.environ.get(name) for name in self.op_list_envs()}
        if now == self._op_lists_at_load:
            return True, ""
        changed = ", ".join(f"{name}={value!r}" for name, value in now.items() if value != self._op_lists_at_load[name])
        return False, (
            f"Habana's software read its op lists when it loaded (at `import torch`), before {changed} was set, so this"
            " process cannot use them (and worker processes started from it would use them while it does not). Set"
            " the variables before Python starts, e.g. `PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST=ops.txt python"
            " train.py`, or `%env` in the notebook's first cell, before anything imports torch."
        )

    # -- facts -----------------------------------------------------------------------------------------------
    def is_available(self) -> bool:
        return bool(self._hthpu.is_available())

    def device_count(self) -> int:
        """The cards this job may use: Habana's count, capped by HABANA_VISIBLE_MODULES when a tenant sets it (HCCL
        asserts each local rank has its module, so asking for more is refused up front instead)."""
        count = int(self._hthpu.device_count())
        modules = visible_modules()
        return min(count, len(modules)) if modules else count

    def generation(self) -> Generation:
        """Read without acquiring a card: Habana's device type, else habana-pyhlml / hl-smi; the device name only
        when this process holds its card already (asking it would acquire one)."""
        if self._generation is None:
            self._generation = self._read_generation()
        return self._generation

    def _read_generation(self) -> Generation:
        generation = _generation_from_device_type()
        if generation is not None:
            return generation
        for source, read in (("pyhlml", hlml.read_facts), ("hl-smi", hlsmi.read_facts)):
            outcome = read(self.facts_timeout)
            for fact in outcome.value or []:
                try:
                    return generation_from_name(fact.name)
                except ValueError:
                    continue
            log.debug("generation from %s unavailable: %s", source, outcome.reason)
        listing = hlsmi.read_listing(self.facts_timeout)
        if listing.value is not None and listing.value.generation:
            return generation_from_name(listing.value.generation)
        if self.device_acquired():
            return generation_from_name(str(self._hthpu.get_device_name()))
        raise HPUNotAvailableError(
            "Cannot tell which Gaudi generation this is without acquiring a card: Habana's device type query, "
            "habana-pyhlml and `hl-smi` gave no answer. Install habana-pyhlml (pip install habana-pyhlml) or put "
            "hl-smi on PATH."
        )

    def release(self) -> Release | None:
        return plugin_release()

    # -- versions and live facts (lazy, cached, never raising) ----------------------------------------------
    def versions(self) -> Versions:
        with self._versions_lock:
            if self._versions is None:
                self._versions = self._read_versions()
            return self._versions

    def _read_versions(self) -> Versions:
        versions = python_stack_versions()
        versions.habana_frameworks = self._habana_frameworks_version()
        version = hlsmi.read_version(self.facts_timeout)
        if version.value is not None:
            versions.synapseai, versions.firmware = version.value.synapseai, version.value.firmware
            # -L is only worth asking once -v has answered: a missing or hanging tool is not asked twice.
            listing = hlsmi.read_listing(self.facts_timeout)
            if listing.value is not None:
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
        """habana_frameworks.torch has no __version__: the habana-torch-plugin distribution's version is it."""
        return plugin_version()

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
        """What habana_frameworks knows without acquiring a card: the count and generation of every card, and the
        memory of the card this process drives when it holds one already."""
        try:
            count, name = self.device_count(), self.device_name()
        except Exception as err:
            self.facts_reasons["runtime"] = f"{type(err).__name__}: {err}"
            return []
        facts = [DeviceFacts(index=i, name=name, source="runtime") for i in range(count)]
        if not self.device_acquired():
            return facts
        try:
            stats = self.memory_stats()
            facts[0].memory_total = stats["Limit"]
            facts[0].memory_used = stats["InUse"]
        except Exception as err:
            self.facts_reasons["runtime memory"] = f"{type(err).__name__}: {err}"
        return facts

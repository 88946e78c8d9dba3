"""The emulated Gaudi: hpu_nb's `hpu` device on the CPU, driven through the emulated `habana_frameworks` surface.

Everything above runs the Gaudi code path unchanged (tensors on `hpu`, autocast on "hpu", HCCL, mark_step,
memory_stats); only the facts about the machine come from the emulation's configuration, and say it is emulated.
"""

from __future__ import annotations

import os

from hpu_nb.runtime import hpu_device
from hpu_nb.runtime.base import DeviceBackend, DeviceFacts, Versions
from hpu_nb.runtime.generations import Generation


def _versions_of_python_stack() -> Versions:
    from importlib.metadata import PackageNotFoundError, version

    def _v(dist: str) -> str | None:
        try:
            return version(dist)
        except PackageNotFoundError:
            return None

    return Versions(torch=_v("torch"), lightning=_v("lightning") or _v("pytorch-lightning"))


class EmulatedBackend(DeviceBackend):
    """A Gaudi of the chosen generation, emulated on the CPU: a real `hpu` device whose kernels run on the host."""

    name = "emulated"
    is_emulated = True

    def __init__(
        self,
        generation: str | None = None,
        memory_limit: int | str | None = None,
        device_count: int | None = None,
    ) -> None:
        from hpu_nb.runtime import emulated_habana

        config = hpu_device.config_from_environment(generation, memory_limit, device_count)
        super().__init__(*emulated_habana.load_surface())
        hpu_device.load(config)

    @property
    def card(self) -> hpu_device.CardConfig:
        """The emulated machine: generation, memory Limit per card, card count."""
        return hpu_device.card_config()

    @property
    def device_count_is_explicit(self) -> bool:
        """HPU_NB_DEVICE_COUNT or HABANA_VISIBLE_MODULES says how many cards to use (devices="auto" uses them all)."""
        return self.card.device_count_is_explicit or bool(os.environ.get("HABANA_VISIBLE_MODULES", "").strip())

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        """The cards this process may use: the machine's, or the tenant's (HABANA_VISIBLE_MODULES)."""
        return int(self._hthpu.device_count())

    def generation(self) -> Generation:
        return self.card.generation

    def versions(self) -> Versions:
        return _versions_of_python_stack()

    def device_facts(self, timeout: float = 2.0) -> list[DeviceFacts]:
        """Every card of the emulated machine; memory in use is known for the card this process drives (hpu:0)."""
        stats = self.memory_stats()
        name = f"{self.card.generation.device_name} (emulated)"
        facts = [DeviceFacts(index=i, name=name, memory_total=self.card.memory_limit, memory_used=0, source="emulated")
                 for i in range(self.card.device_count)]
        facts[0].memory_used, facts[0].memory_peak = stats["InUse"], stats["MaxInUse"]
        return facts

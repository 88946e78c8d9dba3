"""The emulated Gaudi: hpu_nb's `hpu` device on the CPU, driven through the emulated `habana_frameworks` surface.

Everything above runs the Gaudi code path unchanged (tensors on `hpu`, autocast on "hpu", HCCL, mark_step,
memory_stats); only the facts about the machine come from the emulation's configuration, and say it is emulated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpu_nb.emulator import graph_compiler, hpu_device
from hpu_nb.emulator import habana as emulated_habana
from hpu_nb.emulator.fp8.engine import EmulatedFp8Engine
from hpu_nb.emulator.hpu_device import autocast
from hpu_nb.runtime.base import DeviceBackend, DeviceFacts, Versions, python_stack_versions
from hpu_nb.runtime.env import visible_modules
from hpu_nb.runtime.generations import EMULATED_RELEASE, Generation, Release


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
        config = hpu_device.config_from_environment(generation, memory_limit, device_count)
        super().__init__(*emulated_habana.load_surface())
        hpu_device.load(config)
        self._fp8: Any = None

    @property
    def card(self) -> hpu_device.CardConfig:
        """The emulated machine: generation, memory Limit per card, card count."""
        return hpu_device.card_config()

    @property
    def device_count_is_explicit(self) -> bool:
        """HPU_NB_DEVICE_COUNT or HABANA_VISIBLE_MODULES says how many cards to use (devices="auto" uses them all)."""
        return self.card.device_count_is_explicit or bool(visible_modules())

    def is_available(self) -> bool:
        return True

    def auto_device_count(self) -> int:
        """One emulated card unless HPU_NB_DEVICE_COUNT asks for more (each card is a process on this CPU)."""
        return self.device_count() if self.device_count_is_explicit else 1

    def more_cards_hint(self) -> str:
        if visible_modules():
            return super().more_cards_hint()
        return " Set HPU_NB_DEVICE_COUNT to emulate more cards."

    def device_count(self) -> int:
        """The cards this process may use: the machine's, or the tenant's (HABANA_VISIBLE_MODULES)."""
        return int(self._hthpu.device_count())

    def generation(self) -> Generation:
        return self.card.generation

    def release(self) -> Release:
        """The emulated Gaudi behaves as today's software does (eager by default, 1.19+ op-list variables)."""
        return EMULATED_RELEASE

    def graph_compiler(self) -> Callable[..., Any]:
        """AOTAutograd graphs run with the device's kernels, counted as Habana's graph compiler counts."""
        return graph_compiler.emulated_hpu_backend

    def fp8_engine(self) -> Any:
        """fp8 numerics on the CPU, in layers and files shaped like Habana's transformer engine and INC's."""
        if self._fp8 is None:
            self._fp8 = EmulatedFp8Engine()
        return self._fp8

    def can_fork_workers(self) -> tuple[bool, str]:
        """Always: a forked process gets a fresh, empty emulated card of its own."""
        return True, ""

    def versions(self) -> Versions:
        return python_stack_versions()

    def settings_not_in_force(self) -> list[str]:
        """HPU_NB_DEVICE / _MEMORY_LIMIT / _DEVICE_COUNT changed after the emulated card started: it keeps its own."""
        try:
            wanted = hpu_device.config_from_environment()
        except ValueError as err:
            return [f"The environment now asks for an invalid emulated card ({err}); the card keeps its settings."]
        card, notes = self.card, []
        for name, now, asked in (("HPU_NB_DEVICE", card.generation.key, wanted.generation.key),
                                 ("HPU_NB_MEMORY_LIMIT", card.memory_limit, wanted.memory_limit),
                                 ("HPU_NB_DEVICE_COUNT", card.device_count, wanted.device_count)):
            if now != asked:
                notes.append(f"{name} was changed after the emulated card started and is not in force: the card"
                             f" keeps {now!r} (the environment asks for {asked!r}); restart the kernel / process to"
                             " apply it.")
        return notes

    def load_autocast_lists(self) -> tuple[bool, str]:
        """The emulated card can reload its lists at any time (a Gaudi reads them only when its software loads)."""
        autocast.register(autocast.lists_from_environment())
        lower_env, fp32_env = self.op_list_envs()
        return True, (
            "the emulated Gaudi loaded these op lists now; a Gaudi reads them only when Habana's software loads (at"
            f" `import torch`), so there set {lower_env} / {fp32_env} to the list files before Python starts"
        )

    def device_facts(self, timeout: float = 2.0) -> list[DeviceFacts]:
        """Every card of the emulated machine; memory in use is known for the card this process drives (hpu:0)."""
        stats = self.memory_stats()
        name = self.device_label()
        facts = [DeviceFacts(index=i, name=name, memory_total=self.card.memory_limit, memory_used=0, source="emulated")
                 for i in range(self.card.device_count)]
        facts[0].memory_used, facts[0].memory_peak = stats["InUse"], stats["MaxInUse"]
        return facts

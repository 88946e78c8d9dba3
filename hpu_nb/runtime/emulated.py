"""The emulated Gaudi: runs everything for real on the CPU, measures its memory, and says it is emulated."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterable

from hpu_nb.runtime.base import DeviceBackend, DeviceFacts, Versions
from hpu_nb.runtime.env import lazy_mode_from_env, parse_size
from hpu_nb.runtime.generations import GENERATIONS, Generation

DEFAULT_GENERATION = "gaudi2"
DEFAULT_DEVICE_COUNT = 8  # an HLS box: what hl-smi would list


def _versions_of_python_stack() -> Versions:
    from importlib.metadata import PackageNotFoundError, version

    def _v(dist: str) -> str | None:
        try:
            return version(dist)
        except PackageNotFoundError:
            return None

    return Versions(torch=_v("torch"), lightning=_v("lightning") or _v("pytorch-lightning"))


class EmulatedBackend(DeviceBackend):
    """A Gaudi of the chosen generation, emulated on the CPU (tensors live on `cpu`, collectives use gloo)."""

    name = "emulated"
    is_emulated = True
    autocast_device_type = "cpu"
    dist_backend = "gloo"

    def __init__(
        self,
        generation: str | None = None,
        memory_limit: int | str | None = None,
        device_count: int | None = None,
    ) -> None:
        key = (generation or os.environ.get("HPU_NB_DEVICE") or DEFAULT_GENERATION).strip().lower()
        if key not in GENERATIONS:
            raise ValueError(
                f"HPU_NB_DEVICE={key!r} is not an emulated generation; choose one of: {', '.join(GENERATIONS)}."
            )
        self._generation = GENERATIONS[key]
        limit_text = memory_limit if memory_limit is not None else os.environ.get("HPU_NB_MEMORY_LIMIT")
        if limit_text is None:
            self.memory_limit = self._generation.hbm_bytes
        elif isinstance(limit_text, int):
            self.memory_limit = limit_text
        else:
            try:
                self.memory_limit = parse_size(limit_text)
            except ValueError as err:
                raise ValueError(f"HPU_NB_MEMORY_LIMIT: {err}") from None
        count_text = device_count if device_count is not None else os.environ.get("HPU_NB_DEVICE_COUNT")
        self.device_count_is_explicit = count_text is not None
        try:
            self._device_count = int(count_text) if count_text is not None else DEFAULT_DEVICE_COUNT
        except ValueError:
            raise ValueError(f"HPU_NB_DEVICE_COUNT must be a whole number, got {count_text!r}.") from None
        if self._device_count < 1:
            raise ValueError(f"HPU_NB_DEVICE_COUNT must be at least 1, got {self._device_count}.")
        self._memory = None  # created on first use: a process drives one emulated card
        self.mark_step_calls = 0

    # -- facts -----------------------------------------------------------------------------------------------
    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return self._device_count

    def generation(self) -> Generation:
        return self._generation

    def root_device(self, index: int = 0) -> Any:
        import torch

        return torch.device("cpu")

    def is_lazy(self) -> bool:
        return lazy_mode_from_env()

    def versions(self) -> Versions:
        return _versions_of_python_stack()

    def device_facts(self, timeout: float = 2.0) -> list[DeviceFacts]:
        stats = self.memory.stats() if self._memory is not None else None
        return [
            DeviceFacts(
                index=i,
                name=f"{self._generation.device_name} (emulated)",
                memory_total=self.memory_limit,
                memory_used=(stats["InUse"] if stats and i == 0 else 0),
                source="emulated",
            )
            for i in range(self._device_count)
        ]

    # -- memory ----------------------------------------------------------------------------------------------
    @property
    def memory(self):  # noqa: ANN201
        if self._memory is None:
            from hpu_nb.runtime.memory import DeviceMemory

            self._memory = DeviceMemory(self.memory_limit, f"emulated {self._generation.device_name}")
        return self._memory

    def memory_stats(self, index: int = 0) -> dict[str, int]:
        return self.memory.stats()

    def reset_peak_memory_stats(self, index: int = 0) -> None:
        self.memory.reset_peak()

    def on_device(self) -> contextlib.AbstractContextManager[None]:
        return self.memory.tracking()

    def register_on_device(self, tensors: Iterable[Any]) -> None:
        track = self.memory.track
        for tensor in tensors:
            track(tensor)

    # -- execution -------------------------------------------------------------------------------------------
    def mark_step(self) -> None:
        """The emulation executes eagerly; the call is only counted, so tests can see where it happens."""
        self.mark_step_calls += 1

    def synchronize(self) -> None:
        return None

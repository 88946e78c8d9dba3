"""HPUAccelerator: Lightning's view of a Gaudi card (real or emulated), in the shape of CUDAAccelerator."""

from __future__ import annotations

from typing import Any

import torch
from lightning.fabric.accelerators.registry import _AcceleratorRegistry
from lightning.fabric.utilities.types import _DEVICE
from lightning.pytorch.accelerators.accelerator import Accelerator
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from typing_extensions import override

from hpu_nb.core.issues import Issue
from hpu_nb.runtime import get_backend
from hpu_nb.runtime.base import DeviceBackend


class NotAnHPUError(MisconfigurationException, ValueError):
    """An HPU piece was given a device or accelerator that is not an HPU (Lightning's and the plugin's error types)."""


class HPUAccelerator(Accelerator):
    """Accelerator for Intel Gaudi devices; on a machine without one, for the emulated Gaudi.

    One class for the Trainer and for Fabric: Lightning's Trainer accelerator is a Fabric accelerator plus
    `setup(trainer)` and `get_device_stats`.
    """

    def __repr__(self) -> str:
        return "HPUAccelerator()"

    @override
    def setup_device(self, device: torch.device) -> None:
        if device.type != "hpu":
            raise NotAnHPUError(f"Device should be HPU, got {device} instead.")

    @override
    def setup(self, trainer: Any) -> None:
        backend = get_backend()
        rank_zero_info(f"HPU available: True, using: {trainer.num_devices} x {backend.device_name()} ({backend.kind})")

    @override
    def get_device_stats(self, device: _DEVICE | None = None) -> dict[str, Any]:
        """The ten Gaudi memory counters (Limit, InUse, MaxInUse, NumAllocs, ...)."""
        return get_backend().memory_stats(_device_index(device))

    @override
    def teardown(self) -> None:
        pass

    @staticmethod
    @override
    def parse_devices(devices: int | str | list[int]) -> int:
        """Number of HPUs to use, from 1 / "2" / "auto" / -1 (all); anything else is a clear error."""
        return _parse_hpus(devices)

    @staticmethod
    @override
    def get_parallel_devices(devices: int | str) -> list[torch.device]:
        count = _parse_hpus(devices)
        root = get_backend().root_device()
        return [root] * count

    @staticmethod
    @override
    def auto_device_count() -> int:
        """All Gaudi cards on a Gaudi; one emulated card unless HPU_NB_DEVICE_COUNT asks for more."""
        return get_backend().auto_device_count()

    @staticmethod
    @override
    def is_available() -> bool:
        return get_backend().is_available()

    @staticmethod
    def get_device_name() -> str:
        """The generation's name, read without acquiring a card (safe in a launcher process, unlike Habana's
        get_device_name())."""
        return get_backend().device_label()

    @staticmethod
    def is_lazy() -> bool:
        return get_backend().is_lazy()

    @staticmethod
    def is_fp8_available() -> tuple[bool, str]:
        return is_fp8_available()

    @staticmethod
    def is_fp16_available() -> tuple[bool, str]:
        return is_fp16_available()

    @staticmethod
    @override
    def name() -> str:
        return "hpu"

    @classmethod
    @override
    def register_accelerators(cls, accelerator_registry: _AcceleratorRegistry) -> None:
        accelerator_registry.register(cls.name(), cls, description=cls.__name__, override=True)


def is_fp8_available() -> tuple[bool, str]:
    """(available, reason): fp8 needs Gaudi2 or newer (the rule lives in hpu_nb.runtime.generations)."""
    return get_backend().fp8_support()


def is_fp16_available() -> tuple[bool, str]:
    """(available, reason): fp16 needs Gaudi2 or newer (the rule lives in hpu_nb.runtime.generations)."""
    return get_backend().fp16_support()


def _device_index(device: _DEVICE | None) -> int:
    if device is None:
        return 0
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    return device.index or 0


def _parse_hpus(devices: Any) -> int:
    """Number of HPUs from an int, a digit string, "auto", -1 (every card, as Lightning means it) or a list of card
    indices; a clear error otherwise. Lightning asks this while building the Trainer: a PT_HPU_LAZY_MODE that is neither
    "0" nor "1" is refused here too, not only once fit() starts."""
    backend = get_backend()
    backend.check_mode_setting()
    available = backend.device_count()
    if isinstance(devices, bool):
        raise MisconfigurationException(f"`devices={devices!r}` is not a number of HPUs: pass an int, e.g. devices=1.")
    if isinstance(devices, (list, tuple)):
        return _check_hpu_indices(devices, available)
    elif isinstance(devices, str):
        text = devices.strip().lower()
        if text == "auto":
            return HPUAccelerator.auto_device_count()
        if text == "-1":
            return available
        if not text.lstrip("-").isdigit():
            raise MisconfigurationException(
                f"`devices={devices!r}` is not a number of HPUs: pass an int, a digit string, or 'auto'."
            )
        count = int(text)
    elif isinstance(devices, int):
        if devices == -1:
            return available
        count = devices
    else:
        raise MisconfigurationException(
            f"{DEVICES_TYPES}: `devices={devices!r}` of type {type(devices).__name__} is not supported: pass an int,"
            f" a digit string, "
            f"or 'auto'."
        )
    for issue in devices_issues(count, backend, given=devices):
        raise MisconfigurationException(issue.message)
    return count


def devices_issues(count: Any, backend: DeviceBackend, given: Any = None) -> list[Issue]:
    """What is wrong with a number of HPUs (`given`: what the user wrote, for the message): a whole number, at least 1,
    at most the cards this backend has. The Trainer's `devices=` and the config widget both ask here."""
    asked = count if given is None else given
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        return [Issue("devices", f"`devices={asked!r}`: the number of HPUs must be a whole number of at least 1 "
                                 "(or 'auto').")]
    available = backend.device_count()
    if count > available:
        return [Issue("devices", f"`devices={asked!r}` asks for {count} HPUs but only {available} are available "
                                 f"({backend.describe()}).{backend.more_cards_hint()}")]
    return []


# lightning-habana's words, first in every refusal of a `devices` value's type or list (its users' tests match them)
DEVICES_TYPES = "`devices` for `HPUAccelerator` must be int, string or None (or a list of card indices 0..n-1)"


def _check_hpu_indices(devices: list[Any] | tuple[Any, ...], available: int) -> int:
    """A list of card indices: each in range, none twice, and 0..n-1 (each rank drives the card of its local rank).

    Card choice on a Gaudi follows the local rank (Habana's HLS_MODULE_ID / HABANA_VISIBLE_MODULES), so a list
    naming other cards could not be honoured: it is refused rather than silently run on cards 0..n-1.
    """
    if not devices or not all(isinstance(d, int) and not isinstance(d, bool) for d in devices):
        raise MisconfigurationException(f"{DEVICES_TYPES}: `devices={devices!r}` must be a non-empty list of HPU"
                                        " indices (ints).")
    backend = get_backend()
    out_of_range = sorted({d for d in devices if not 0 <= d < available})
    if out_of_range:
        hint = backend.more_cards_hint()
        raise MisconfigurationException(
            f"{DEVICES_TYPES}: `devices={list(devices)!r}` names HPU {', '.join(map(str, out_of_range))}, but the"
            f" valid indices are 0..{available - 1} ({available} card(s), {backend.describe()}).{hint}"
        )
    duplicates = sorted({d for d in devices if list(devices).count(d) > 1})
    if duplicates:
        raise MisconfigurationException(
            f"{DEVICES_TYPES}: `devices={list(devices)!r}` lists HPU {', '.join(map(str, duplicates))} more than"
            f" once: each rank needs a card of its own. Pass distinct indices, or devices={len(set(devices))}."
        )
    if sorted(devices) != list(range(len(devices))):
        raise MisconfigurationException(
            f"{DEVICES_TYPES}: `devices={list(devices)!r}`: each rank drives the card of its local rank, so a list"
            f" of indices must be 0..{len(devices) - 1}. To train on cards {', '.join(map(str, sorted(devices)))}, set"
            f" HABANA_VISIBLE_MODULES={','.join(map(str, sorted(devices)))} and pass devices={len(devices)}."
        )
    return len(devices)

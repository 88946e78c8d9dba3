"""habana_frameworks.torch.utils.experimental, emulated: which Gaudi generation this is."""

from __future__ import annotations

import enum

from hpu_nb.emulator import hpu_device


class synDeviceType(enum.IntEnum):  # noqa: N801 (Habana's name)
    synDeviceGaudi = 1
    synDeviceGaudi2 = 2
    synDeviceGaudi3 = 3


def _get_device_type() -> synDeviceType:
    return synDeviceType[{"gaudi": "synDeviceGaudi", "gaudi2": "synDeviceGaudi2", "gaudi3": "synDeviceGaudi3"}[
        hpu_device.card_config().generation.key]]


def _is_fp16_supported() -> bool:
    return hpu_device.card_config().generation.supports_fp16

"""habana_frameworks.torch.utils.experimental, emulated: which Gaudi generation this is, and the recompilation
detector (`detect_recompilation_auto_model`, `data_dynamicity`, `const_shape_dataloader`), as the bridge's package."""

from __future__ import annotations

import enum

from habana_frameworks.torch.utils.experimental.detect_recompilation import (  # noqa: F401  (re-exported as Habana's)
    const_shape_dataloader,
    data_dynamicity,
    detect_recompilation_auto_model,
)

from hpu_nb.emulator import hpu_device

__emulated__ = True


class synDeviceType(enum.IntEnum):
    synDeviceGaudi = 1
    synDeviceGaudi2 = 2
    synDeviceGaudi3 = 3


def _get_device_type() -> synDeviceType:
    return synDeviceType[{"gaudi": "synDeviceGaudi", "gaudi2": "synDeviceGaudi2", "gaudi3": "synDeviceGaudi3"}[
        hpu_device.card_config().generation.key]]


def _is_fp16_supported() -> bool:
    return hpu_device.card_config().generation.supports_fp16

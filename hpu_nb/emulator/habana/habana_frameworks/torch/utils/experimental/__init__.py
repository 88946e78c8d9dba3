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
from hpu_nb.runtime.generations import GENERATIONS

__emulated__ = True


# Habana's enum (synDeviceGaudi = 1, synDeviceGaudi2 = 2, synDeviceGaudi3 = 3), its members named by the generations
synDeviceType = enum.IntEnum(
    "synDeviceType", [(gen.syn_device_type, number) for number, gen in enumerate(GENERATIONS.values(), start=1)])


def _get_device_type() -> synDeviceType:
    return synDeviceType[hpu_device.card_config().generation.syn_device_type]


def _is_fp16_supported() -> bool:
    return hpu_device.card_config().generation.supports_fp16

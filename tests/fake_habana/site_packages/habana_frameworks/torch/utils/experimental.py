"""Fake habana_frameworks.torch.utils.experimental: the device type, readable before a card is acquired.

As in the bridge (synapse_helpers::device::get_device_type), `_get_device_type()` counts the machine's devices by type
without acquiring one; optimum-habana reads the generation this way.
"""

import enum

from habana_frameworks._fake import STATE as _STATE
from habana_frameworks._fake import SYN_DEVICE_TYPES as _TYPES
from habana_frameworks._fake import recorded as _recorded


class synDeviceType(enum.IntEnum):
    synDeviceGaudi = _TYPES["GAUDI"]
    synDeviceGaudi2 = _TYPES["GAUDI2"]
    synDeviceGaudi3 = _TYPES["GAUDI3"]
    synDeviceTypeInvalid = 99


@_recorded
def _get_device_type():
    """An int, as the bridge's C++ binding returns (compare it with synDeviceType members)."""
    if not _STATE.config.available or _STATE.config.device_count < 1:
        return int(synDeviceType.synDeviceTypeInvalid)
    return _TYPES[_STATE.config.device_name.upper()]


@_recorded
def _is_fp16_supported():
    return _get_device_type() != synDeviceType.synDeviceGaudi

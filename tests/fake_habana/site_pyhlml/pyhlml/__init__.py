"""Fake habana-pyhlml (the libhlml wrapper), reading the fake Gaudi's cards; calls are recorded too.

DELAY_S makes every call block that long (a wedged driver); FAIL_INIT makes hlmlInit raise.
"""

import time
from types import SimpleNamespace

from habana_frameworks._fake import STATE as _STATE
from habana_frameworks._fake import recorded as _recorded

DELAY_S = 0.0
FAIL_INIT = None  # an error message, or None
UTILIZATION = 37  # percent, every card
TEMPERATURE = 41  # Celsius, every card
POWER_MW = 182_000

PRODUCT_NAMES = {"GAUDI": b"HL-205", "GAUDI2": b"HL-225", "GAUDI3": b"HL-325L"}


class HLMLError(Exception):
    pass


def _wait():
    if DELAY_S:
        time.sleep(DELAY_S)


@_recorded
def hlmlInit():
    _wait()
    if FAIL_INIT:
        raise HLMLError(FAIL_INIT)


@_recorded
def hlmlShutdown():
    return None


@_recorded
def hlmlDeviceGetCount():
    _wait()
    return _STATE.config.device_count if _STATE.config.available else 0


@_recorded
def hlmlDeviceGetHandleByIndex(index):
    if not 0 <= index < (_STATE.config.device_count if _STATE.config.available else 0):
        raise HLMLError(f"invalid index {index}")
    return index


@_recorded
def hlmlDeviceGetName(handle):
    return PRODUCT_NAMES.get(_STATE.config.device_name.upper(), b"HL-225")


@_recorded
def hlmlDeviceGetMemoryInfo(handle):
    card = _STATE.card(handle)
    return SimpleNamespace(total=card.limit, used=card.in_use, free=card.limit - card.in_use)


@_recorded
def hlmlDeviceGetUtilizationRates(handle):
    return UTILIZATION


@_recorded
def hlmlDeviceGetTemperature(handle, sensor_type):
    return TEMPERATURE


@_recorded
def hlmlDeviceGetPowerUsage(handle):
    return POWER_MW

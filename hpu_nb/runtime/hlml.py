"""Device facts from habana-pyhlml (`pyhlml`, the Python wrapper of libhlml.so), when it is installed.

libhlml answers without starting a process, so it is the first choice for live facts; a call into a
wedged driver could still block, so the query runs in a daemon thread and is abandoned at the timeout.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from typing import Any

from hpu_nb.runtime.base import DeviceFacts
from hpu_nb.runtime.hlsmi import DEFAULT_TIMEOUT, Outcome

TEMPERATURE_SENSOR_AIP = 0  # hlmlDeviceGetTemperature sensor types: 0 = AIP (on chip), 1 = board


def load_pyhlml() -> Outcome[Any]:
    """The pyhlml module, or None and why it cannot be used."""
    try:
        return Outcome(importlib.import_module("pyhlml"))
    except Exception as err:  # ImportError, or an OSError from a missing libhlml.so
        return Outcome(None, f"habana-pyhlml is not usable ({type(err).__name__}: {err})")


def read_facts(timeout: float = DEFAULT_TIMEOUT) -> Outcome[list[DeviceFacts]]:
    """Memory, utilization, temperature and power of every card, read through libhlml."""
    loaded = load_pyhlml()
    if not loaded.ok:
        return Outcome(None, loaded.reason)
    result: list[Outcome[list[DeviceFacts]]] = []
    worker = threading.Thread(target=lambda: result.append(_query(loaded.value)), name="hpu_nb-hlml", daemon=True)
    worker.start()
    worker.join(timeout)
    if not result:
        return Outcome(None, f"habana-pyhlml did not answer within {timeout:g} s")
    return result[0]


def _query(hlml: Any) -> Outcome[list[DeviceFacts]]:
    try:
        hlml.hlmlInit()
    except Exception as err:
        return Outcome(None, f"hlmlInit failed ({type(err).__name__}: {err})")
    try:
        facts = []
        for index in range(int(hlml.hlmlDeviceGetCount())):
            handle = hlml.hlmlDeviceGetHandleByIndex(index)
            name = hlml.hlmlDeviceGetName(handle)
            memory = hlml.hlmlDeviceGetMemoryInfo(handle)  # .total / .used / .free, bytes
            facts.append(
                DeviceFacts(
                    index=index,
                    name=name.decode(errors="replace") if isinstance(name, bytes) else str(name),
                    memory_total=int(memory.total),
                    memory_used=int(memory.used),
                    utilization=float(hlml.hlmlDeviceGetUtilizationRates(handle)),
                    temperature=float(hlml.hlmlDeviceGetTemperature(handle, TEMPERATURE_SENSOR_AIP)),
                    power=hlml.hlmlDeviceGetPowerUsage(handle) / 1000.0,  # mW -> W
                    source="pyhlml",
                )
            )
        return Outcome(facts)
    except Exception as err:
        return Outcome(None, f"habana-pyhlml failed ({type(err).__name__}: {err})")
    finally:
        with contextlib.suppress(Exception):
            hlml.hlmlShutdown()

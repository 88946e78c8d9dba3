"""Which strategy and precision plugin a Trainer gets when its accelerator is an HPU.

Called from the connector hook in registration.py; kept apart so the rules are readable in one place.
"""

from __future__ import annotations

from typing import Any

PARALLEL_STRATEGY_NAME = "hpu_parallel"


def is_hpu_accelerator(flag: Any) -> bool:
    from hpu_nb.core.accelerator import HPUAccelerator

    return isinstance(flag, HPUAccelerator) or (isinstance(flag, str) and flag.lower() == "hpu")


def choose_strategy(connector: Any) -> Any:
    """SingleHPUStrategy for one device, the HPUParallelStrategy family for several (or several nodes)."""
    from hpu_nb.core.strategies.single import SingleHPUStrategy

    devices = connector._parallel_devices
    if len(devices) <= 1 and connector._num_nodes_flag == 1:
        return SingleHPUStrategy(device=devices[0] if devices else None)
    return PARALLEL_STRATEGY_NAME


def choose_precision(connector: Any) -> Any:
    """The precision plugin for an HPU Trainer given only `precision=...` (no plugin instance)."""
    flag = connector._precision_flag
    own = getattr(connector.strategy, "hpu_precision_plugin", None)
    if callable(own):  # DeepSpeed / FSDP strategies bring their own plugin class
        return own(flag)
    from hpu_nb.core.precision import HPUPrecisionPlugin

    return HPUPrecisionPlugin(precision=flag)

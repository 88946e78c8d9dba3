"""Which strategy and precision plugin an HPU Trainer or Fabric gets: the rules, once for both.

Called from the connector hooks in registration.py; kept apart so the rules are readable in one place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpu_nb.core.accelerator import HPUAccelerator
from hpu_nb.core.fabric.precision import HPUPrecision
from hpu_nb.core.precision import HPUFp8Mixin, HPUPrecisionPlugin, unify_precision
from hpu_nb.core.strategies.fsdp import HPUFSDPPrecisionMixin
from hpu_nb.core.strategies.hpu_steps import HPUAcceleratorOnly

if TYPE_CHECKING:
    import torch

PARALLEL_STRATEGY_NAME = "hpu_parallel"  # registered with the Trainer's and with Fabric's strategy registry


def is_hpu_accelerator(flag: Any) -> bool:
    return isinstance(flag, HPUAccelerator) or (isinstance(flag, str) and flag.lower() == "hpu")


def asks_for_hpu(strategy: Any, plugins: Any) -> bool:
    """Whether an explicit HPU strategy (an instance, or a registered "hpu..." name) or HPU precision plugin was given:
    with accelerator="auto" that means the HPU, as with lightning-habana (its strategies and plugins said so)."""
    if isinstance(strategy, HPUAcceleratorOnly) or (isinstance(strategy, str) and strategy.lower().startswith("hpu")):
        return True
    plugins = plugins if isinstance(plugins, (list, tuple)) else [plugins]
    hpu_precisions = (HPUPrecisionPlugin, HPUFp8Mixin, HPUFSDPPrecisionMixin, HPUPrecision)
    return any(isinstance(plugin, hpu_precisions) for plugin in plugins)


def choose_strategy(parallel_devices: list[torch.device], num_nodes: int, single_strategy: type) -> Any:
    """The single-HPU strategy for one device, the HPUParallelStrategy family for several (or several nodes)."""
    if len(parallel_devices) <= 1 and num_nodes == 1:
        return single_strategy(device=parallel_devices[0] if parallel_devices else None)
    return PARALLEL_STRATEGY_NAME


def hpu_only_precision(precision: Any) -> str | None:
    """The unified name of a precision only hpu_nb's HPU plugins run ("fp8"), else None.

    Lightning's connectors refuse names they do not know before any precision plugin is chosen: given with an HPU
    accelerator, the connector hook carries such a name past that check to choose_precision."""
    return "fp8" if unify_precision(precision) == "fp8" else None


def choose_precision(strategy: Any, precision: Any, default_plugin: type) -> Any:
    """The precision plugin for `precision=...` given without a plugin instance: the strategy's own kind when it has
    one (DeepSpeed, FSDP), else `default_plugin` (HPUPrecisionPlugin for the Trainer, HPUPrecision for Fabric)."""
    own = getattr(strategy, "hpu_precision_plugin", None)
    if callable(own):
        return own(precision)
    return default_plugin(precision=precision)

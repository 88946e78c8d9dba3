"""Which strategy and precision plugin an HPU Trainer or Fabric gets: the rules, once for both.

Called from the connector hooks in registration.py; kept apart so the rules are readable in one place.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from hpu_nb.core.accelerator import HPUAccelerator
from hpu_nb.core.fabric.precision import HPUPrecision
from hpu_nb.core.precision import HPUFp8Mixin, HPUPrecisionPlugin, unify_precision
from hpu_nb.core.strategy_parts.fsdp import HPUFSDPPrecisionMixin
from hpu_nb.core.strategy_parts.guards import HPUAcceleratorOnly
from hpu_nb.core.strategy_parts.launchers import in_interactive_session

if TYPE_CHECKING:
    import torch

PARALLEL_STRATEGY_NAME = "hpu_parallel"  # registered with the Trainer's and with Fabric's strategy registry

# Lightning's multi-device strategy families (by class name in Lightning's modules, the Trainer's and Fabric's alike)
# and the hpu_nb name that does the same on HPU
_HPU_FAMILY = {"DDPStrategy": "hpu_ddp", "DeepSpeedStrategy": "hpu_deepspeed", "FSDPStrategy": "hpu_fsdp"}


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


def hpu_strategy_for_lightning_name(strategy: Any, registry: Any, owner: str) -> Any:
    """With an HPU accelerator, Lightning's own multi-device names ("ddp", "ddp_notebook", "ddp_spawn",
    "deepspeed_stage_3", "fsdp_cpu_offload", ...) build hpu_nb's HPU strategy with the same arguments, or None for any
    other strategy. Lightning's own classes would train on HPU tensors through CUDA / CPU code paths: in a notebook
    Lightning refuses "ddp" and "deepspeed" with the advice to use "ddp_notebook", whose DDPStrategy then dies in
    worker 1. "ddp_notebook" / "ddp_fork" keep their fork start method, "ddp_spawn" its spawn, "ddp" is hpu_nb's
    "auto" (fork in a notebook, a script launcher elsewhere). A family hpu_nb lacks for `owner` is a ValueError naming
    what to use instead."""
    if not isinstance(strategy, str) or strategy.lower().startswith("hpu") or strategy not in registry:
        return None
    entry = registry[strategy]
    family = next((klass.__name__ for klass in entry["strategy"].__mro__
                   if klass.__module__.startswith(("lightning.pytorch.", "lightning.fabric."))
                   and klass.__name__ in _HPU_FAMILY), None)
    if family is None or issubclass(entry["strategy"], HPUAcceleratorOnly):
        return None
    hpu_name = _HPU_FAMILY[family]
    if hpu_name not in registry:
        raise ValueError(
            f"{owner}(accelerator='hpu', strategy={strategy!r}): hpu_nb has no HPU {family} for the {owner}. Use "
            f"strategy='hpu_ddp' (or plain devices=N) for data parallel on HPU cards.")
    params = dict(entry["init_params"])
    if params.get("start_method") == "popen":  # Lightning's "ddp": a script launcher, refused in a notebook
        params["start_method"] = "auto"  # hpu_nb's: fork in a notebook, the script launcher elsewhere
    if params.get("start_method") == "spawn" and in_interactive_session():
        raise ValueError(
            f"{owner}(accelerator='hpu', strategy={strategy!r}): spawned workers cannot start from a notebook (they "
            f"import its code again). Use strategy='hpu_ddp' or 'ddp_notebook' (forked workers), or plain devices=N.")
    hpu_entry = registry[hpu_name]
    return hpu_entry["strategy"](**{**hpu_entry["init_params"], **params})


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


def precision_plugin_class(strategy: Any, default_plugin: type = HPUPrecisionPlugin) -> type:
    """The class of precision plugin a strategy (class or instance) gets for `precision=...`: the strategy's own kind
    when it has one (DeepSpeed, FSDP: `hpu_precision_plugin`), else `default_plugin` (HPUPrecisionPlugin for the
    Trainer, HPUPrecision for Fabric). A strategy given by name ("hpu_single", "auto") has none of its own."""
    own = getattr(strategy, "hpu_precision_plugin", None)
    return own if isinstance(own, type) else default_plugin


def takes_op_lists(plugin: type) -> bool:
    """Whether a precision plugin class applies op lists (`lower_list` / `fp32_list`): HPUPrecisionPlugin does; the
    DeepSpeed and FSDP plugins take none (their precision is the engine's / FSDP's own)."""
    return "lower_list" in inspect.signature(plugin).parameters


def choose_precision(strategy: Any, precision: Any, default_plugin: type) -> Any:
    """The precision plugin for `precision=...` given without a plugin instance (precision_plugin_class's)."""
    return precision_plugin_class(strategy, default_plugin)(precision=precision)

"""Make Lightning know the HPU: registry entries plus the smallest, version-checked hooks into its connectors.

Lightning 2.6 removed its Gaudi support: `Trainer(accelerator="hpu")` raises "HPU is currently not supported" and
an `HPUAccelerator()` instance silently gets a CPU SingleDeviceStrategy; Fabric picks a CPU strategy and CUDA's
autocast. For the Trainer's connector and for Fabric's we wrap the same four methods (the flag check, which refuses
precision="fp8"; strategy choice, precision choice, the auto accelerator) and delegate to Lightning for everything
that is not an HPU. The rules themselves live in selection.py, once for both.
`hpu_nb/wiring/lightning_registration.py` runs `register_all()` as soon as Lightning is imported, whichever comes
first; for the standalone `pytorch_lightning` / `lightning_fabric` packages it runs this module's translation
(hpu_nb/wiring/flavours.py).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from lightning.fabric.accelerators import ACCELERATOR_REGISTRY as FABRIC_ACCELERATORS
from lightning.fabric.accelerators import Accelerator
from lightning.fabric.connector import _Connector as FabricConnector
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.plugins.precision import Precision
from lightning.fabric.strategies import STRATEGY_REGISTRY as FABRIC_STRATEGIES
from lightning.fabric.strategies import Strategy as FabricStrategy
from lightning.pytorch import __version__ as lightning_pytorch_version  # `lightning` itself may be mid-import
from lightning.pytorch.accelerators import AcceleratorRegistry
from lightning.pytorch.plugins import LayerSync
from lightning.pytorch.plugins import Precision as TrainerPrecision
from lightning.pytorch.strategies import Strategy, StrategyRegistry
from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector as TrainerConnector

from hpu_nb.core import selection
from hpu_nb.core.accelerator import HPUAccelerator
from hpu_nb.core.fabric.precision import HPUPrecision
from hpu_nb.core.fabric.strategies import SingleHPUStrategy as FabricSingleHPUStrategy
from hpu_nb.core.precision import HPUPrecisionPlugin
from hpu_nb.core.profiler import register_profiler_string
from hpu_nb.core.strategies.single import SingleHPUStrategy
from hpu_nb.core.trainer_output import install as install_trainer_output
from hpu_nb.runtime import get_backend
from hpu_nb.runtime.habana_install import real_habana_spec
from hpu_nb.wiring import flavours

DISTRIBUTION = "hpu_nb"

# Strategy modules; each lists its Strategy classes in __all__.
STRATEGY_MODULES = (
    "hpu_nb.core.strategies.single",
    "hpu_nb.core.strategies.parallel",
    "hpu_nb.core.strategies.deepspeed",
    "hpu_nb.core.strategies.fsdp",
)

FABRIC_STRATEGY_MODULES = ("hpu_nb.core.fabric.strategies",)

_HOOKED_METHODS = ("_check_config_and_set_final_flags", "_choose_strategy", "_check_and_init_precision",
                   "_choose_auto_accelerator")
_registered = False
_STRATEGY_REGISTRIES = {"Trainer": StrategyRegistry, "Fabric": FABRIC_STRATEGIES}
FLAVOUR = str(flavours.flavour_of_module(__name__))  # "lightning", or "standalone" in this module's translation
# What the connectors take as strategy / accelerator / plugins (anything else is their "invalid" error)
_ACCEPTED = (Strategy, FabricStrategy, Accelerator, Precision, TrainerPrecision, CheckpointIO, ClusterEnvironment,
             LayerSync)


def supported_lightning() -> str:
    """The Lightning releases hpu_nb is tested with, as pyproject.toml's dependency says ("<2.7,>=2.6"), or "" where
    hpu_nb runs without its metadata (a source tree on sys.path): then no release is called untested."""
    from importlib.metadata import PackageNotFoundError, requires  # noqa: PLC0415 -- lazy: asked once, at hooking

    from packaging.requirements import Requirement  # noqa: PLC0415 -- lazy: as above

    name = flavours.DISTRIBUTIONS[FLAVOUR]
    try:
        required = [Requirement(line) for line in requires(DISTRIBUTION) or ()]
    except PackageNotFoundError:
        return ""
    return next((str(req.specifier) for req in required if req.name == name and not req.marker), "")


def is_supported_lightning() -> bool:
    from packaging.specifiers import SpecifierSet  # noqa: PLC0415 -- lazy: asked once, at hooking

    return SpecifierSet(supported_lightning()).contains(lightning_pytorch_version, prereleases=True)


def register_all() -> None:
    """Register accelerator, strategies and profiler names with the Trainer's and Fabric's registries, and hook both
    connectors. Idempotent."""
    global _registered
    if _registered:
        return
    HPUAccelerator.register_accelerators(AcceleratorRegistry)
    HPUAccelerator.register_accelerators(FABRIC_ACCELERATORS)  # one accelerator class serves both
    for trainer_strategy in _strategy_classes(STRATEGY_MODULES):
        if issubclass(trainer_strategy, Strategy):
            trainer_strategy.register_strategies(StrategyRegistry)
    for fabric_strategy in _strategy_classes(FABRIC_STRATEGY_MODULES):
        if issubclass(fabric_strategy, FabricStrategy):
            fabric_strategy.register_strategies(FABRIC_STRATEGIES)
    register_profiler_string()
    install_connector_hook()
    install_trainer_output()  # an HPU Trainer says which HPU it uses, instead of Lightning's GPU / TPU lines
    install_fabric_connector_hook()
    _registered = True


def _strategy_classes(modules: tuple[str, ...]) -> list[type]:
    """The classes the modules list in `__all__` that name a strategy of their own (`strategy_name`)."""
    classes: list[type] = []
    for name in modules:
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", ()):
            obj = getattr(module, attr)
            if isinstance(obj, type) and "strategy_name" in vars(obj):
                classes.append(obj)
    return classes


def install_connector_hook() -> bool:
    """Wrap the Trainer connector's strategy / precision / auto-accelerator choice for HPU. Returns whether it is in."""
    def precision_for_hpu(connector: Any) -> Any:
        if connector._precision_plugin_flag is not None:
            return None  # a plugin instance was given: Lightning's own checks apply
        connector._validate_precision_choice()
        return selection.choose_precision(connector.strategy, connector._precision_flag, HPUPrecisionPlugin)

    return _hook_connector(TrainerConnector, "Trainer", SingleHPUStrategy, precision_for_hpu,
                           ("_precision_flag", "_precision_plugin_flag"))


def install_fabric_connector_hook() -> bool:
    """The same for Fabric's connector: `Fabric(accelerator="hpu", devices=N, strategy=..., precision=...)`."""
    def precision_for_hpu(connector: Any) -> Any:
        if isinstance(connector._precision_instance, Precision):
            return None
        return selection.choose_precision(connector.strategy, connector._precision_input, HPUPrecision)

    return _hook_connector(FabricConnector, "Fabric", FabricSingleHPUStrategy, precision_for_hpu,
                           ("_precision_input", "_precision_instance"))


def _hook_connector(
    connector: Any, owner: str, single_strategy: type, precision_for_hpu: Any, precision_attrs: tuple[str, str]
) -> bool:
    """Wrap `_check_config_and_set_final_flags` (for "fp8"), `_choose_strategy`, `_check_and_init_precision` and
    `_choose_auto_accelerator` of a connector class. `precision_attrs`: the connector's precision flag and precision
    plugin attributes."""
    if getattr(connector, "_hpu_nb_hooked", False):
        return True
    missing = [name for name in _HOOKED_METHODS if not hasattr(connector, name)]
    if missing or not is_supported_lightning():
        warnings.warn(
            f"hpu_nb is tested with Lightning {supported_lightning()}; this is Lightning {lightning_pytorch_version}"
            + (f", whose {owner} connector lacks {', '.join(missing)}" if missing else "")
            + ". "
            + (f"{owner}(accelerator='hpu') cannot be wired up: pass strategy=SingleHPUStrategy() explicitly."
               if missing else "The HPU hook is installed but untested on this version."),
            RuntimeWarning,
            stacklevel=3,
        )
        if missing:
            return False

    original_flags = connector._check_config_and_set_final_flags
    original_choose_strategy = connector._choose_strategy
    original_precision = connector._check_and_init_precision
    original_auto: Callable[..., str] = connector._choose_auto_accelerator

    flags_signature = inspect.signature(original_flags)
    flag_attr, plugin_attr = precision_attrs

    @functools.wraps(original_flags)
    def _check_config_and_set_final_flags(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = flags_signature.bind(self, *args, **kwargs)
        refuse_other_flavour(owner, call.arguments)
        if selection.is_hpu_accelerator(call.arguments.get("accelerator")):
            hpu_strategy = selection.hpu_strategy_for_lightning_name(call.arguments.get("strategy"),
                                                                     _STRATEGY_REGISTRIES[owner], owner)
            if hpu_strategy is not None:  # "ddp", "ddp_notebook", "deepspeed_stage_3", ...: hpu_nb's HPU strategy
                call.arguments["strategy"] = hpu_strategy
                args, kwargs = call.args[1:], call.kwargs
        precision, accelerator = call.arguments.get("precision"), call.arguments.get("accelerator")
        if getattr(call.arguments.get("strategy"), "parallel_devices_defaulted", False):
            # devices the strategy only defaulted (known before set-up, as lightning-habana's): Lightning would take
            # them over `devices=`; let it choose from `devices=` instead
            call.arguments["strategy"].parallel_devices = None
            call.arguments["strategy"].parallel_devices_defaulted = False
        if accelerator in ("auto", None) and selection.asks_for_hpu(call.arguments.get("strategy"),
                                                                     call.arguments.get("plugins")):
            call.arguments["accelerator"] = accelerator = "hpu"
            args, kwargs = call.args[1:], call.kwargs
        kept = selection.hpu_only_precision(precision)
        on_hpu = selection.is_hpu_accelerator(accelerator) or (accelerator in ("auto", None) and _auto_means_hpu())
        if kept is None or not on_hpu:
            return original_flags(self, *args, **kwargs)
        call.arguments["precision"] = None  # a name Lightning does not know: it is set below instead
        result = original_flags(*call.args, **call.kwargs)
        if getattr(self, plugin_attr) is not None:
            raise ValueError(f"Received both `precision={precision!r}` and `plugins={getattr(self, plugin_attr)}`."
                             " Choose one.")
        setattr(self, flag_attr, kept)
        return result

    @functools.wraps(original_choose_strategy)
    def _choose_strategy(self: Any) -> Any:
        if selection.is_hpu_accelerator(self._accelerator_flag):
            return selection.choose_strategy(self._parallel_devices, self._num_nodes_flag, single_strategy)
        return original_choose_strategy(self)

    @functools.wraps(original_precision)
    def _check_and_init_precision(self: Any) -> Any:
        if selection.is_hpu_accelerator(self.accelerator):
            plugin = precision_for_hpu(self)
            if plugin is not None:
                return plugin
        return original_precision(self)

    @functools.wraps(original_auto)
    def _choose_auto_accelerator(*args: Any) -> str:
        if _auto_means_hpu():
            return "hpu"
        return original_auto(*args)

    connector._check_config_and_set_final_flags = _check_config_and_set_final_flags
    connector._choose_strategy = _choose_strategy
    connector._check_and_init_precision = _check_and_init_precision
    connector._choose_auto_accelerator = staticmethod(_choose_auto_accelerator)
    connector._hpu_nb_hooked = True
    connector._hpu_nb_originals = {
        "_check_config_and_set_final_flags": original_flags,
        "_choose_strategy": original_choose_strategy,
        "_check_and_init_precision": original_precision,
        "_choose_auto_accelerator": original_auto,
    }
    return True


def refuse_other_flavour(owner: str, arguments: dict[str, Any]) -> None:
    """An hpu_nb piece built for the other Lightning package (`lightning` vs `pytorch_lightning` / `lightning_fabric`)
    as strategy, accelerator or plugin is a LightningFlavourError naming the import to use, where Lightning would say
    only "invalid type" / "invalid name"."""
    plugins = arguments.get("plugins")
    plugins = list(plugins) if isinstance(plugins, Iterable) and not isinstance(plugins, str) else [plugins]
    for piece in (arguments.get("strategy"), arguments.get("accelerator"), *plugins):
        if isinstance(piece, _ACCEPTED):
            continue
        message = flavours.other_flavour_message(piece, FLAVOUR, owner)
        if message is not None:
            raise flavours.LightningFlavourError(message)


def _real_gaudi_present() -> bool:
    """accelerator="auto" means HPU only on a real Gaudi; the emulated one is never chosen implicitly."""
    if real_habana_spec() is None:
        return False

    try:
        return get_backend().name == "gaudi"
    except Exception:
        return False


GPU_MIGRATION_MODULE = "habana_frameworks.torch.gpu_migration"


def _auto_means_hpu() -> bool:
    """accelerator="auto" means HPU on a real Gaudi, and in a process running Habana's GPU Migration Toolkit (its
    own choice to run CUDA code on the Gaudi). The toolkit makes torch.cuda answer for the HPU, so Lightning alone
    would pick CUDAAccelerator over torch.cuda.device_count() cards; on Habana's software Lightning's auto choice
    asks for the HPU before CUDA (lightning-habana's accelerator; hpu_nb's on a Gaudi), and devices="auto" is then
    HPUAccelerator's: every card on a Gaudi, one on the emulated Gaudi unless HPU_NB_DEVICE_COUNT asks for more."""
    return GPU_MIGRATION_MODULE in sys.modules or _real_gaudi_present()

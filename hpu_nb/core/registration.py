"""Make Lightning know the HPU: registry entries plus the smallest, version-checked hook into its connector.

Lightning 2.6 removed its Gaudi support: `Trainer(accelerator="hpu")` raises "HPU is currently not supported" and
an `HPUAccelerator()` instance silently gets a CPU SingleDeviceStrategy. We wrap exactly two connector methods
(strategy choice, precision choice) and delegate to Lightning for every non-HPU Trainer.
`hpu_nb/__init__.py` runs `register_all()` as soon as `lightning.pytorch` is imported, whichever comes first.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from typing import Any

SUPPORTED_LIGHTNING = ((2, 6), (2, 7))  # [low, high)

# Strategy modules; each lists its Strategy classes in __all__.
STRATEGY_MODULES = (
    "hpu_nb.core.strategies.single",
    "hpu_nb.core.strategies.parallel",
    "hpu_nb.core.strategies.deepspeed",
    "hpu_nb.core.strategies.fsdp",
)

_HOOKED_METHODS = ("_choose_strategy", "_check_and_init_precision", "_choose_auto_accelerator")
_registered = False


def lightning_version() -> tuple[int, ...]:
    import lightning

    parts = []
    for piece in lightning.__version__.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def is_supported_lightning() -> bool:
    low, high = SUPPORTED_LIGHTNING
    return low <= lightning_version()[:2] < high


def register_all() -> None:
    """Register accelerator, strategies and profiler names with Lightning, and hook the connector. Idempotent."""
    global _registered
    if _registered:
        return
    from lightning.pytorch.accelerators import AcceleratorRegistry
    from lightning.pytorch.strategies import StrategyRegistry

    from hpu_nb.core.accelerator import HPUAccelerator

    HPUAccelerator.register_accelerators(AcceleratorRegistry)
    for strategy_cls in _strategy_classes():
        strategy_cls.register_strategies(StrategyRegistry)
    _register_profiler()
    install_connector_hook()
    from hpu_nb.core.trainer_output import install as install_trainer_output

    install_trainer_output()  # an HPU Trainer says which HPU it uses, instead of Lightning's GPU / TPU lines
    _registered = True


def _strategy_classes() -> list[type]:
    from lightning.pytorch.strategies import Strategy

    classes = []
    for name in STRATEGY_MODULES:
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", ()):
            obj = getattr(module, attr)
            if isinstance(obj, type) and issubclass(obj, Strategy) and "strategy_name" in vars(obj):
                classes.append(obj)
    return classes


def _register_profiler() -> None:
    from hpu_nb.core.profiler import register_profiler_string

    register_profiler_string()


def install_connector_hook() -> bool:
    """Wrap the connector's strategy / precision / auto-accelerator choice for HPU. Returns whether it is installed."""
    from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector as Connector

    if getattr(Connector, "_hpu_nb_hooked", False):
        return True
    missing = [name for name in _HOOKED_METHODS if not hasattr(Connector, name)]
    if missing or not is_supported_lightning():
        import lightning

        warnings.warn(
            f"hpu_nb supports Lightning 2.6.x; this is Lightning {lightning.__version__}"
            + (f", whose connector lacks {', '.join(missing)}" if missing else "")
            + ". "
            + ("Trainer(accelerator='hpu') cannot be wired up: pass strategy=SingleHPUStrategy() explicitly."
               if missing else "The HPU hook is installed but untested on this version."),
            RuntimeWarning,
            stacklevel=2,
        )
        if missing:
            return False

    from hpu_nb.core.selection import choose_precision, choose_strategy, is_hpu_accelerator

    original_choose_strategy = Connector._choose_strategy
    original_precision = Connector._check_and_init_precision
    original_auto = Connector._choose_auto_accelerator

    @functools.wraps(original_choose_strategy)
    def _choose_strategy(self: Any) -> Any:
        if is_hpu_accelerator(self._accelerator_flag):
            return choose_strategy(self)
        return original_choose_strategy(self)

    @functools.wraps(original_precision)
    def _check_and_init_precision(self: Any) -> Any:
        if self._precision_plugin_flag is None and is_hpu_accelerator(self.accelerator):
            self._validate_precision_choice()
            return choose_precision(self)
        return original_precision(self)

    @functools.wraps(original_auto)
    def _choose_auto_accelerator(*args: Any) -> str:
        if _real_gaudi_present():
            return "hpu"
        return original_auto(*args)

    Connector._choose_strategy = _choose_strategy
    Connector._check_and_init_precision = _check_and_init_precision
    Connector._choose_auto_accelerator = staticmethod(_choose_auto_accelerator)
    Connector._hpu_nb_hooked = True
    Connector._hpu_nb_originals = {
        "_choose_strategy": original_choose_strategy,
        "_check_and_init_precision": original_precision,
        "_choose_auto_accelerator": original_auto,
    }
    return True


def _real_gaudi_present() -> bool:
    """accelerator="auto" means HPU only on a real Gaudi; the emulated one is never chosen implicitly."""
    from hpu_nb.runtime import get_backend
    from hpu_nb.runtime.emulated_habana import real_habana_spec

    if real_habana_spec() is None:
        return False

    try:
        return get_backend().name == "gaudi"
    except Exception:  # noqa: BLE001 - a broken Habana install must not break accelerator="auto"
        return False

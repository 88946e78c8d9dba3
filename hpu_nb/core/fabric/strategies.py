"""Fabric's HPU strategies: thin adapters of the pieces shared with the Trainer's (hpu_nb.core.strategy_parts).

Fabric has strategy classes of its own (`lightning.fabric.strategies`), so each HPU strategy needs a Fabric class; what
they do is written once for both flavours: the card (`HPUParallelMixin.root_device`), HCCL set-up and reduce semantics,
the launcher choice (script / fork in a notebook / spawn) and its fork check (`HPUParallelMixin`), HPUCheckpointIO by
default (`HPUCheckpointIODefault`), FSDP's eager-mode rule and precision (strategy_parts/fsdp.py), and the launchers'
liveness (`ScriptLivenessMixin`, `WorkerLivenessMixin`). Fabric's own: its launchers (rank 0's value comes back as
bytes), and where lazy mode's mark_step goes: Fabric's `backward` and `optimizer_step`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from lightning.fabric.strategies.ddp import DDPStrategy
from lightning.fabric.strategies.fsdp import FSDPStrategy
from lightning.fabric.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from lightning.fabric.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning.fabric.strategies.single_device import SingleDeviceStrategy
from lightning.fabric.utilities.types import _DEVICE, _PATH
from typing_extensions import override

from hpu_nb.core import noise
from hpu_nb.core.accelerator import HPUAccelerator
from hpu_nb.core.fabric import worker_result
from hpu_nb.core.fabric.precision import HPUFSDPPrecision
from hpu_nb.core.strategy_parts.fsdp import check_eager_mode, sharded_tensors_on_hpu
from hpu_nb.core.strategy_parts.guards import HPUAcceleratorOnly, HPUCheckpointIODefault
from hpu_nb.core.strategy_parts.interrupts import stopped_message
from hpu_nb.core.strategy_parts.launchers import ProcessStartMethod, ScriptLivenessMixin, WorkerLivenessMixin
from hpu_nb.core.strategy_parts.parallel import HPUParallelMixin
from hpu_nb.runtime import get_backend

if TYPE_CHECKING:
    from lightning.fabric.strategies import Strategy as FabricStrategyHost
else:
    FabricStrategyHost = object  # a base for the type checker only: the Fabric Strategy it is mixed into

__all__ = ["HPUDDPStrategy", "HPUFSDPStrategy", "HPUParallelStrategy", "SingleHPUStrategy"]


class _FabricMultiProcessingLauncher(WorkerLivenessMixin, _MultiProcessingLauncher):
    """Fabric's fork/spawn launcher, with the Gaudi fork check and the Trainer's liveness (WorkerLivenessMixin)."""

    @override
    def launch(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return worker_result.unpack(super().launch(function, *args, **kwargs))  # rank 0's value, sent as bytes

    @override
    def _wrapping_function(self, process_idx: int, function: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        function = worker_result.returning_bytes(function)
        return super()._wrapping_function(process_idx, self._worker_function(function), *args, **kwargs)


class _FabricSubprocessScriptLauncher(ScriptLivenessMixin, _SubprocessScriptLauncher):
    """Fabric's script launcher, with the Trainer's liveness (ScriptLivenessMixin): `fabric.launch()` returns before the
    training runs, so rank 0 keeps the ranks it started in check for the rest of its life."""


class _FabricHPUSteps(HPUAcceleratorOnly, HPUCheckpointIODefault, FabricStrategyHost):
    """Lazy mode cuts the graph after backward and after the optimizer step (a no-op in eager mode)."""

    @override
    def backward(self, tensor: torch.Tensor, module: Any, *args: Any, **kwargs: Any) -> None:
        super().backward(tensor, module, *args, **kwargs)
        get_backend().mark_step()

    @override
    def optimizer_step(self, optimizer: Any, **kwargs: Any) -> Any:
        output = super().optimizer_step(optimizer, **kwargs)
        get_backend().mark_step()
        return output


class _FabricParallel(HPUParallelMixin):
    """HPUParallelMixin with Fabric's launchers, and what a rank outside every Fabric call is doing: the user's own
    loop."""

    _idle_phase = "the script's own code (no Fabric call)"

    @property
    @override
    def _start_up_interrupted_line(self) -> str:
        return stopped_message(None, trainer=False)

    @override
    def _script_launcher(self) -> Any:
        return _FabricSubprocessScriptLauncher(
            self, self.cluster_environment, self.num_processes, self.num_nodes
        )

    @override
    def _process_launcher(self, start_method: ProcessStartMethod) -> Any:
        return _FabricMultiProcessingLauncher(self, start_method=start_method)


def _register(cls: type, registry: Any, *names: str, **init_params: Any) -> None:
    for name in names:
        registry.register(name, cls, description=(cls.__doc__ or cls.__name__).splitlines()[0], override=True,
                          **init_params)


class SingleHPUStrategy(_FabricHPUSteps, SingleDeviceStrategy):
    """Fabric on one HPU: `Fabric(accelerator="hpu", devices=1)`, or `strategy="single_hpu"`."""

    strategy_name = "single_hpu"

    def __init__(self, device: _DEVICE | None = "hpu", accelerator: Any = None, checkpoint_io: Any = None,
                 precision: Any = None) -> None:
        if device is None or str(device) == "hpu":  # what Gaudi users write: this process's card, hpu:0
            device = get_backend().root_device()
        super().__init__(device=device, accelerator=accelerator, checkpoint_io=checkpoint_io, precision=precision)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        _register(cls, strategy_registry, cls.strategy_name, "hpu_single")  # the plugin's Fabric name, the Trainer's


class HPUParallelStrategy(_FabricParallel, _FabricHPUSteps, DDPStrategy):
    """Fabric DDP across Gaudi cards over HCCL: `Fabric(accelerator="hpu", devices=N)`, or `strategy="hpu_parallel"`.

    start_method: "auto" (fork in a notebook, Lightning's script launcher elsewhere), "popen", "fork" or "spawn".
    """

    strategy_name = "hpu_parallel"  # Lightning's DDPStrategy arguments; start_method is HPUParallelMixin's

    def __init__(self, accelerator: Any = None, parallel_devices: list[torch.device] | None = None, *args: Any,
                 default_devices: bool = True, **kwargs: Any) -> None:
        defaulted = parallel_devices is None and default_devices  # not for the instances Fabric makes from a name
        if defaulted:  # known at once, as lightning-habana's were; Fabric's `devices=` still decides (registration.py)
            parallel_devices = HPUAccelerator.get_parallel_devices(HPUAccelerator.auto_device_count())
        super().__init__(accelerator, parallel_devices, *args, **kwargs)
        self.parallel_devices_defaulted = defaulted

    @override
    def setup_module(self, module: torch.nn.Module) -> Any:
        # DDP's first forwards print a C++ "Time stats ..." warning (no DDP timer for HPU): the user's loop calls them
        return noise.quiet_first_forwards(super().setup_module(module), noise.OnceNativeMessage(noise.DDP_TIME_STATS))

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        _register(cls, strategy_registry, cls.strategy_name, default_devices=False)


class HPUDDPStrategy(HPUParallelStrategy):
    """The same strategy under the name DDP users look for: `Fabric(accelerator="hpu", strategy="hpu_ddp")`."""

    strategy_name = "hpu_ddp"


class HPUFSDPStrategy(_FabricParallel, HPUAcceleratorOnly, FSDPStrategy):
    """Fabric FSDP on HPU (eager mode): Lightning's FSDPStrategy arguments, `precision=HPUFSDPPrecision(...)`."""

    strategy_name = "hpu_fsdp"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        check_eager_mode()
        sharded_tensors_on_hpu()
        if kwargs.get("precision") is not None:
            kwargs["precision"] = HPUFSDPPrecision.from_plugin(kwargs["precision"])
        super().__init__(*args, **kwargs)

    # what `Fabric(precision=...)` means with this strategy (made by hpu_nb's connector hook)
    hpu_precision_plugin: ClassVar[type[HPUFSDPPrecision]] = HPUFSDPPrecision

    @property
    @override
    def precision(self) -> HPUFSDPPrecision:
        plugin = self._precision  # set by the setter below only: an HPUFSDPPrecision, or None
        return plugin if isinstance(plugin, HPUFSDPPrecision) else HPUFSDPPrecision("32-true")

    @precision.setter
    @override
    def precision(self, precision: Any) -> None:
        self._precision = None if precision is None else HPUFSDPPrecision.from_plugin(precision)

    @override
    def setup_environment(self) -> None:
        check_eager_mode()
        super().setup_environment()

    # torch 2.13's FutureWarnings on the state-dict APIs Lightning's FSDP checkpointing calls (core.noise)
    @override
    def save_checkpoint(self, path: _PATH, state: dict[str, Any], storage_options: Any | None = None,
                        filter: dict[str, Callable[[str, Any], bool]] | None = None) -> None:
        with noise.quiet_fsdp_state_dicts():
            super().save_checkpoint(path, state, storage_options=storage_options, filter=filter)

    @override
    def load_checkpoint(self, path: _PATH, state: Any = None, strict: bool = True,
                        weights_only: bool | None = None) -> dict[str, Any]:
        with noise.quiet_fsdp_state_dicts():
            return super().load_checkpoint(path, state, strict=strict, weights_only=weights_only)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        _register(cls, strategy_registry, cls.strategy_name)

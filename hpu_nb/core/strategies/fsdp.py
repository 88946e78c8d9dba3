"""HPUFSDPStrategy and HPUFSDPPrecision (Trainer): PyTorch FSDP across Gaudi cards (gloo on the emulated Gaudi).

Habana runs FSDP in eager mode only; that rule and what FSDP precision means on HPU are shared with Fabric's FSDP
(hpu_nb.core.strategy_parts.fsdp). Lightning's FSDPStrategy does the sharding, with full or sharded state dicts; this
subclass keeps its own registry list (Lightning refuses its FSDP names off CUDA) and its
precision autocasts on the backend's device type instead of "cuda".
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
from typing import Any, ClassVar

import lightning.pytorch.strategies.fsdp as pl_fsdp
import torch
from lightning.pytorch.plugins.precision.fsdp import FSDPPrecision
from lightning.pytorch.strategies.fsdp import (
    FSDPStrategy,
    _move_torchmetrics_to_device,
    _setup_activation_checkpointing,
)
from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType
from torch.distributed.fsdp.api import FullOptimStateDictConfig
from torch.distributed.fsdp.wrap import enable_wrap
from typing_extensions import override

from hpu_nb.core.noise import quiet_fsdp_state_dicts
from hpu_nb.core.strategies.launchers import HPUMultiProcessingLauncher
from hpu_nb.core.strategies.parallel import HPUTrainerParallelMixin
from hpu_nb.core.strategy_parts.fsdp import (
    FSDP_PRECISIONS,
    HPUFSDPPrecisionMixin,
    check_eager_mode,
    fsdp_issues,
    sharded_tensors_on_hpu,
    validate_fsdp_precision,
)

__all__ = [  # the shared rules and precision mixin too, importable here as before
    "FSDP_PRECISIONS",
    "HPUFSDPPrecision",
    "HPUFSDPPrecisionMixin",
    "HPUFSDPStrategy",
    "check_eager_mode",
    "fsdp_issues",
    "validate_fsdp_precision",
]


class HPUFSDPPrecision(HPUFSDPPrecisionMixin, FSDPPrecision):
    """FSDP precision for HPU (Trainer): autocast on "hpu"; fp16 needs Gaudi2 or newer."""

    def __init__(self, precision: str | int = "32-true", scaler: Any = None) -> None:
        self._init_fsdp_precision(precision, scaler)


class HPUFSDPStrategy(HPUTrainerParallelMixin, FSDPStrategy):
    """Fully Sharded Data Parallel on HPU (eager mode), `state_dict_type="full"` or `"sharded"` checkpoints.

    Takes Lightning's FSDPStrategy arguments (sharding_strategy, auto_wrap_policy, activation_checkpointing_policy,
    cpu_offload, state_dict_type, ...), plus start_method as HPUParallelStrategy.
    """

    strategy_name = "hpu_fsdp"
    _registered_strategies: list[str] = []  # not Lightning's list: its FSDP names are refused off CUDA

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        check_eager_mode()
        sharded_tensors_on_hpu()
        super().__init__(*args, **kwargs)

    hpu_precision_plugin: ClassVar[type[HPUFSDPPrecision]] = HPUFSDPPrecision  # what Trainer(precision=...) gets

    @property
    @override
    def precision_plugin(self) -> FSDPPrecision:
        plugin = self._precision_plugin
        if plugin is not None:
            assert isinstance(plugin, FSDPPrecision)  # the setter takes no other (as Lightning's FSDPStrategy)
            return plugin
        return HPUFSDPPrecision("32-true")

    @precision_plugin.setter
    @override
    def precision_plugin(self, plugin: Any) -> None:
        if plugin is not None and not isinstance(plugin, FSDPPrecision):
            raise TypeError(f"HPUFSDPStrategy works with HPUFSDPPrecision, got {type(plugin).__name__}.")
        self._precision_plugin = plugin

    @override
    def setup_environment(self) -> None:
        check_eager_mode()
        super().setup_environment()

    @override
    def _get_process_group_backend(self) -> str:
        # FSDPStrategy.setup_environment asks for the backend right before init_process_group: prepare HCCL here.
        return self._prepare_hpu_distributed()

    # -- FSDP needs the device named explicitly: torch refuses a CPU module without device_id ------------------------
    @override
    def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        if any(isinstance(mod, FullyShardedDataParallel) for mod in model.modules()):
            self.kwargs.pop("auto_wrap_policy", None)  # wrapped by the user: their wrapping stands
        else:
            model = FullyShardedDataParallel(
                module=model,
                cpu_offload=self.cpu_offload,
                mixed_precision=self.mixed_precision_config,
                sharding_strategy=self.sharding_strategy,
                device_id=self.root_device,
                **self.kwargs,
            )
        _move_torchmetrics_to_device(model, self.root_device)
        _setup_activation_checkpointing(model, self._activation_checkpointing_kwargs)
        return model

    @contextmanager
    @override
    def model_sharded_context(self) -> Generator[None, None, None]:
        with enable_wrap(
            wrapper_cls=FullyShardedDataParallel,
            cpu_offload=self.cpu_offload,
            mixed_precision=self.mixed_precision_config,
            sharding_strategy=self.sharding_strategy,
            device_id=self.root_device,
            **self.kwargs,
        ):
            yield

    # -- full state dicts: FSDP's "offload to CPU" crashes when the device already is the CPU (emulated Gaudi) --------
    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        with _full_state_dict_offload(self.root_device.type != "cpu"):
            return super().lightning_module_state_dict()

    def full_state_dict(self) -> dict[str, Any]:
        """The whole model's weights, unflattened, on rank 0 (the other ranks get {}), whatever `state_dict_type`:
        what the notebook's model loads after a forked fit. A collective: every rank calls it."""
        assert self.model is not None
        # Lightning annotates _get_full_state_dict_context as a Generator; it returns FSDP's state_dict_type context
        with _full_state_dict_offload(self.root_device.type != "cpu"), \
                pl_fsdp._get_full_state_dict_context(self.model, world_size=self.world_size):  # type: ignore[attr-defined]
            return self.model.state_dict()

    @override
    def _process_launcher(self, start_method: str) -> Any:
        return _FSDPMultiProcessingLauncher(self, start_method=start_method)

    @override
    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        with _full_state_dict_offload(self.root_device.type != "cpu"):
            return super().optimizer_state(optimizer)

    @override
    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        with _full_state_dict_offload(self.root_device.type != "cpu"):
            return super().load_checkpoint(checkpoint_path, weights_only)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        assert cls.__doc__ is not None  # its first line describes the strategy
        strategy_registry.register(cls.strategy_name, cls, description=cls.__doc__.splitlines()[0], override=True)
        if cls.strategy_name not in cls._registered_strategies:
            cls._registered_strategies.append(cls.strategy_name)


class _FSDPMultiProcessingLauncher(HPUMultiProcessingLauncher):
    """The fork / spawn launcher for FSDP: rank 0 hands the launching process (a notebook's kernel) the full weights.

    Lightning's launcher sends rank 0's `lightning_module.state_dict()`, which under FSDP holds rank 0's flattened
    shards (`net.0.weight` of shape [1089]): the notebook's model then fails to load them. Here every rank joins the
    full state dict's gather first and rank 0 sends that.
    """

    _strategy: HPUFSDPStrategy

    @override
    def _collect_rank_zero_results(self, trainer: Any, results: Any) -> Any:
        full = self._strategy.full_state_dict()
        module = trainer.lightning_module
        module.state_dict = lambda *args, **kwargs: full  # what Lightning's launcher saves for the launching process
        try:
            return super()._collect_rank_zero_results(trainer, results)
        finally:
            del module.state_dict


@contextmanager
def _full_state_dict_offload(offload: bool) -> Generator[None, None, None]:
    """Lightning always asks FSDP for offload_to_cpu=True full state dicts; on a CPU device that frees storage still in
    use (a segfault in torch 2.13). Scoped to one call: Lightning's helper with offload_to_cpu=False on the CPU. Both
    go through FSDP.state_dict_type, deprecated by torch 2.13 with a FutureWarning no user can act on (core.noise)."""
    with quiet_fsdp_state_dicts():
        if offload:
            yield
            return
        original = pl_fsdp._get_full_state_dict_context

        def without_offload(module: Any, world_size: int, rank0_only: bool = True) -> Any:
            return FullyShardedDataParallel.state_dict_type(
                module=module,
                state_dict_type=StateDictType.FULL_STATE_DICT,
                state_dict_config=FullStateDictConfig(offload_to_cpu=False, rank0_only=rank0_only),
                optim_state_dict_config=FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=rank0_only),
            )

        pl_fsdp._get_full_state_dict_context = without_offload
        try:
            yield
        finally:
            pl_fsdp._get_full_state_dict_context = original

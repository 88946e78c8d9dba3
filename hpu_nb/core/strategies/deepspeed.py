"""HPUDeepSpeedStrategy: DeepSpeed ZeRO on Gaudi (and on the emulated Gaudi).

On a Gaudi this drives Habana's DeepSpeed fork over HCCL (with DEEPSPEED_USE_HPU / PT_HPU_LAZY_ACC_PAR_MODE=0 set
before DeepSpeed is imported); on the emulated Gaudi, DeepSpeed's same HPU accelerator on the emulated `hpu` device
and HCCL.
Lightning's DeepSpeedStrategy does the ZeRO work; this subclass drops its "CUDA only" check, sets up the device
side, validates configurations up front, and lets the LightningModule's optimizer win over the config's.
DeepSpeed is optional (`pip install 'hpu_nb[deepspeed]'`) and only imported when a strategy is created.
Its other jobs have a module each: the configuration rules (deepspeed_config.py), the precision plugin
(deepspeed_precision.py), DeepSpeed's inference engine (deepspeed_inference.py).
"""

from __future__ import annotations

import copy
import functools
import json
import os
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import torch
from lightning.fabric.strategies.deepspeed import _format_precision_config
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.core.optimizer import _init_optimizers_and_lr_schedulers, _MockOptimizer
from lightning.pytorch.strategies.ddp import DDPStrategy
from lightning.pytorch.strategies.deepspeed import DeepSpeedStrategy
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.model_helpers import is_overridden
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from typing_extensions import override

from hpu_nb.core import noise
from hpu_nb.core.strategies import deepspeed_ops
from hpu_nb.core.strategies.deepspeed_config import (
    EXTRA_HINT,
    OPTIMIZER_OFFLOAD_STAGES,
    ZERO_STAGES,
    apply_issues,
    deepspeed_issues,
    inference_keys,
    require_deepspeed,
    validate_zero_config,
)
from hpu_nb.core.strategies.deepspeed_inference import DeepSpeedInferenceMixin
from hpu_nb.core.strategies.deepspeed_precision import (
    DEEPSPEED_PRECISIONS,
    HPUDeepSpeedPrecisionPlugin,
    engine_precision_of,
)
from hpu_nb.core.strategies.launchers import HPUMultiProcessingLauncher
from hpu_nb.core.strategies.parallel import HPUTrainerParallelMixin
from hpu_nb.core.strategy_parts import rank_processes
from hpu_nb.runtime import get_backend
from hpu_nb.runtime.files import UnreadableFileError, read_small_file

__all__ = [  # the configuration rules and the precision plugin too, importable here as before
    "DEEPSPEED_PRECISIONS", "EXTRA_HINT", "OPTIMIZER_OFFLOAD_STAGES", "ZERO_STAGES", "HPUDeepSpeedPrecisionPlugin",
    "HPUDeepSpeedStrategy", "deepspeed_issues", "engine_precision_of", "require_deepspeed", "validate_zero_config",
]


def _deepspeed_groups_wait_at_most(timeout: timedelta) -> None:
    """Make DeepSpeed's own process groups wait at most the collective timeout, as the world group does.

    DeepSpeed's comm layer (deepspeed/comm/torch.py, TorchBackend.new_group) makes every group of its own -- the clone
    of the world group its engine and ZeRO reduce the gradients on (deepspeed/utils/groups.py, _clone_world_group),
    the data / expert / tensor parallel groups -- with torch.distributed.new_group(ranks) and no timeout: torch's
    default for the backend (30 minutes for gloo and HCCL), not the one init_distributed passed to the world group.
    A rank stuck before its backward then held its peers in the gradient reduce until the liveness backstop (timeout
    + 60 s), where every other collective names it at the timeout. Its backend is made to pass the timeout."""
    from deepspeed.comm import comm as deepspeed_comm  # noqa: PLC0415 -- lazy: deepspeed is optional

    backend = deepspeed_comm.cdb  # set by init_distributed
    if backend is not None and callable(getattr(backend, "new_group", None)):
        backend.new_group = functools.partial(torch.distributed.new_group, timeout=timeout)



class HPUDeepSpeedStrategy(HPUTrainerParallelMixin, DeepSpeedInferenceMixin, DeepSpeedStrategy):
    """DeepSpeed on HPU: ZeRO-1/2/3, offload, BF16, activation checkpointing; arguments or a JSON config dict/file.

    Takes Lightning's DeepSpeedStrategy arguments (zero_optimization, stage, offload_optimizer, offload_parameters,
    cpu_checkpointing, config, ...). When both the LightningModule and the config define an optimizer (or scheduler),
    the LightningModule's wins. Arguments of `deepspeed.init_inference` (dtype, tensor_parallel,
    replace_with_kernel_inject, injection_policy, ...), given here or in the config, make validate / test / predict
    run through DeepSpeed's inference engine, as with lightning-habana.
    """

    strategy_name = "hpu_deepspeed"

    def __init__(
        self,
        *args: Any,
        config: str | Path | dict[str, Any] | None = None,
        zero_optimization: bool = True,
        stage: int = 2,
        offload_optimizer: bool = False,
        offload_parameters: bool = False,
        start_method: str | None = "auto",
        **kwargs: Any,
    ) -> None:
        require_deepspeed()
        inference_kwargs = {key: kwargs.pop(key) for key in list(kwargs) if key in inference_keys()}
        apply_issues(deepspeed_issues(stage=stage))
        if isinstance(config, dict):
            config = copy.deepcopy(config)  # Lightning fills in the config; keep the user's dict as it was
        elif isinstance(config, (str, Path)) and not os.path.exists(config):
            raise MisconfigurationException(  # lightning-habana's (and Lightning's) words first
                f"You passed in a path to a DeepSpeed config but the path does not exist: DeepSpeed config file"
                f" {str(config)!r} does not exist.")
        elif isinstance(config, (str, Path)):
            try:
                config = json.loads(read_small_file(config, "DeepSpeed config file"))
            except UnreadableFileError as err:
                raise MisconfigurationException(str(err)) from None
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                raise MisconfigurationException(f"DeepSpeed config file {str(config)!r} is not valid JSON: "
                                                f"{err}") from None
        if config is None:  # the arguments make the config; with ZeRO on, validate_zero_config warns about offload
            apply_issues(deepspeed_issues(stage=stage, zero_optimization=zero_optimization,
                                    offload_parameters=offload_parameters,
                                    offload_optimizer=offload_optimizer and not zero_optimization))
        super().__init__(
            *args,
            config=config,
            zero_optimization=zero_optimization,
            stage=stage,
            offload_optimizer=offload_optimizer,
            offload_parameters=offload_parameters,
            start_method=start_method,
            **kwargs,
        )
        assert self.config is not None  # Lightning's __init__ builds one from the arguments when none is given
        validate_zero_config(self.config, get_backend())
        self.inference_kwargs = inference_kwargs

    # -- precision: the plugin hpu_nb's selection hook makes for Trainer(precision=...) -------------------------
    hpu_precision_plugin: ClassVar[type[HPUDeepSpeedPrecisionPlugin]] = HPUDeepSpeedPrecisionPlugin

    # -- a config that enables bf16 / fp16 sets the precision, as in lightning-habana's BF16-optimizer example -
    @override
    def setup(self, trainer: Any) -> None:
        self._adopt_config_precision()
        super().setup(trainer)

    def _adopt_config_precision(self) -> None:
        assert isinstance(self.config, dict)
        wanted = next(
            (p for key, p in (("bf16", "bf16-mixed"), ("fp16", "16-mixed"))
             if (self.config.get(key) or {}).get("enabled")),
            None,
        )
        if wanted is not None and self.precision_plugin.precision == "32-true":
            rank_zero_info(f"The DeepSpeed config enables {wanted.split('-')[0]}: training with precision={wanted!r}.")
            self.precision_plugin = HPUDeepSpeedPrecisionPlugin(wanted)

    # -- fp8: DeepSpeed runs the rest in bf16 (the plugin's engine precision) -------------------------------------
    @override
    def _format_config(self) -> None:
        super()._format_config()
        plugin = self.precision_plugin
        engine_precision = getattr(plugin, "engine_precision", plugin.precision)
        if engine_precision == plugin.precision:
            return
        assert isinstance(self.config, dict)
        if (self.config.get("fp16") or {}).get("enabled"):
            raise MisconfigurationException(
                f"precision={plugin.precision!r} runs DeepSpeed in bf16, but the DeepSpeed config enables fp16: remove"
                " its 'fp16' section (or enable 'bf16' instead)."
            )
        _format_precision_config(self.config, engine_precision, self.loss_scale, self.loss_scale_window,
                                 self.min_loss_scale, self.initial_scale_power, self.hysteresis)

    # -- environment: no "CUDA only" check; HCCL (Gaudi) or gloo (emulated) ----------------------------------------
    @override
    def setup_environment(self) -> None:
        # skips DeepSpeedStrategy's CUDA-only check (and the mixin's, hence the mixin's two steps here)
        with rank_processes.joining_process_group(self._start_up_interrupted_line):
            DDPStrategy.setup_environment(self)
        self._start_progress_reports()  # a stuck rank is named, as with every HPU strategy

    @override
    def setup_distributed(self) -> None:
        reset_seed()
        self.set_world_ranks()
        self._init_deepspeed_distributed()

    @override
    def _init_deepspeed_distributed(self) -> None:
        import deepspeed  # noqa: PLC0415 -- lazy: deepspeed is optional

        assert self.cluster_environment is not None
        self._set_node_environment_variables()
        backend = self._prepare_hpu_distributed()
        deepspeed.init_distributed(backend, distributed_port=self.cluster_environment.main_port, timeout=self._timeout)
        _deepspeed_groups_wait_at_most(self._collective_timeout)
        noise.use_current_collective_names()  # torch's current names: no deprecation warning at every step

    # -- deepspeed.initialize: each process drives its own card, named by its local rank ------------------------
    @override
    def _setup_model_and_optimizer(self, model: Any, optimizer: Any, lr_scheduler: Any = None) -> tuple[Any, Any]:
        import deepspeed  # noqa: PLC0415 -- lazy: deepspeed is optional

        with noise.quiet_deepspeed_initialize():  # no "untested optimizer": Lightning lets every optimizer through
            engine, ds_optimizer, _, _ = deepspeed.initialize(
                args=self._deepspeed_args(),
                config=self.config,
                model=model,
                model_parameters=[p for p in model.parameters() if p.requires_grad],
                optimizer=optimizer,
                lr_scheduler=lr_scheduler,
                dist_init_required=False,
            )
        return engine, ds_optimizer

    # -- checkpoints: DeepSpeed's engine calls torch's barrier itself (ZeRO-3 gathers, then every rank waits) ----
    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        with noise.quiet_barrier():  # torch's "barrier(): using the device under current context" (noise.py)
            super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    @override
    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        with noise.quiet_barrier():
            return super().load_checkpoint(checkpoint_path, weights_only=weights_only)

    # -- optimizers: the LightningModule's win over the config's -------------------------------------------------
    @override
    def _initialize_deepspeed_train(self, model: Any) -> None:
        assert isinstance(self.config, dict)
        module = self.lightning_module
        if module is not None and is_overridden("configure_optimizers", module) and "optimizer" in self.config:
            rank_zero_info(
                "Both the LightningModule and the DeepSpeed config define an optimizer: using"
                " LightningModule.configure_optimizers() (and its scheduler, if any)."
            )
            self.config.pop("optimizer")
            if self._module_has_scheduler():
                self.config.pop("scheduler", None)
        self._use_inference_engine(None)
        super()._initialize_deepspeed_train(model)

    @override
    def _init_optimizers(self) -> tuple[Any, Any]:
        optimizer, scheduler = super()._init_optimizers()
        if isinstance(optimizer, _MockOptimizer):  # else DeepSpeed fails later with an IndexError on its param groups
            raise MisconfigurationException(
                "You have specified an invalid optimizer to be run with deepspeed: configure_optimizers() returned"
                " None. DeepSpeed trains with one optimizer: return it from configure_optimizers(), or define one in"
                " the DeepSpeed config's 'optimizer' section."
            )
        return optimizer, scheduler

    @override
    def _process_launcher(self, start_method: Any) -> Any:
        """Fork / spawn: the launcher that sends the launching process whole ZeRO-3 weights."""
        return _DeepSpeedMultiProcessingLauncher(self, start_method=start_method)

    def _module_has_scheduler(self) -> bool:
        assert self.lightning_module is not None
        _, schedulers = _init_optimizers_and_lr_schedulers(self.lightning_module)
        return bool(schedulers)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        entries: tuple[tuple[str, str, dict[str, Any]], ...] = (
            ("hpu_deepspeed", "DeepSpeed on HPU (ZeRO stage 2)", {}),
            ("hpu_deepspeed_stage_1", "DeepSpeed ZeRO stage 1 on HPU", {"stage": 1}),
            ("hpu_deepspeed_stage_2", "DeepSpeed ZeRO stage 2 on HPU", {"stage": 2}),
            ("hpu_deepspeed_stage_2_offload", "DeepSpeed ZeRO stage 2 with CPU optimizer offload on HPU",
             {"stage": 2, "offload_optimizer": True}),
            ("hpu_deepspeed_stage_3", "DeepSpeed ZeRO stage 3 on HPU", {"stage": 3}),
            ("hpu_deepspeed_stage_3_offload", "DeepSpeed ZeRO stage 3 with CPU optimizer and parameter offload on HPU",
             {"stage": 3, "offload_optimizer": True, "offload_parameters": True}),
            ("hpu_deepspeed_stage_3_offload_nvme", "DeepSpeed ZeRO-Infinity: stage 3 offloading to NVMe on HPU",
             {"stage": 3, "offload_optimizer": True, "offload_parameters": True, "remote_device": "nvme",
              "offload_params_device": "nvme", "offload_optimizer_device": "nvme"}),
        )
        for name, description, init_kwargs in entries:
            strategy_registry.register(name, cls, description=description, override=True, **init_kwargs)


class _DeepSpeedMultiProcessingLauncher(HPUMultiProcessingLauncher):
    """The fork / spawn launcher for DeepSpeed: under ZeRO-3 rank 0 hands the launching process (a notebook's kernel)
    the whole weights.

    ZeRO-3 partitions every parameter above `stage3_param_persistence_threshold` (and any a GatheredParameters block
    gave back): rank 0's `state_dict()` then holds empty tensors, which the notebook's model refuses (size mismatch).
    Here every rank joins the parameters' gather and rank 0 sends the gathered copy, as the FSDP launcher does.
    """

    _strategy: HPUDeepSpeedStrategy

    @override
    def launch(self, function: Callable[..., Any], *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        """ZeRO-Offload steps DeepSpeedCPUAdam, a C++ op: where it is still to be compiled, this process compiles it
        before any worker starts, saying so (deepspeed_ops.build_announced), rather than a worker in silence. Not when
        the config lets a torch optimizer step on the CPU (`zero_force_ds_cpu_optimizer: false`): nothing loads it."""
        config = self._strategy.config or {}
        offload = (config.get("zero_optimization") or {}).get("offload_optimizer") or {}
        if offload.get("device") in ("cpu", "nvme") and config.get("zero_force_ds_cpu_optimizer", True) is not False:
            deepspeed_ops.build_announced()
        return super().launch(function, *args, trainer=trainer, **kwargs)

    @override
    def _collect_rank_zero_results(self, trainer: Any, results: Any) -> Any:
        if not self._strategy.zero_stage_3:
            return super()._collect_rank_zero_results(trainer, results)
        import deepspeed  # noqa: PLC0415 -- lazy: deepspeed is optional

        module = trainer.lightning_module
        with deepspeed.zero.GatheredParameters(list(module.parameters())):
            full = {name: tensor.detach().clone() for name, tensor in module.state_dict().items()}
        module.state_dict = lambda *args, **kwargs: full  # what Lightning's launcher saves for the launching process
        try:
            return super()._collect_rank_zero_results(trainer, results)
        finally:
            del module.state_dict

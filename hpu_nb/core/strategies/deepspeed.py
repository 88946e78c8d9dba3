"""HPUDeepSpeedStrategy and HPUDeepSpeedPrecisionPlugin: DeepSpeed ZeRO on Gaudi (and on the emulated Gaudi).

On a Gaudi this drives Habana's DeepSpeed fork over HCCL (with DEEPSPEED_USE_HPU / PT_HPU_LAZY_ACC_PAR_MODE=0 set
before DeepSpeed is imported); on the emulated Gaudi, DeepSpeed's same HPU accelerator on the emulated `hpu` device
and HCCL.
Lightning's DeepSpeedStrategy does the ZeRO work; this subclass drops its "CUDA only" check, sets up the device
side, validates configurations up front, and lets the LightningModule's optimizer win over the config's.
DeepSpeed is optional (`pip install 'hpu_nb[deepspeed]'`) and only imported when a strategy is created.
"""

from __future__ import annotations

import argparse
import copy
import functools
import importlib.util
import json
import os
import weakref
from contextlib import AbstractContextManager
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeGuard

import torch
from lightning.fabric.plugins.precision.utils import _convert_fp_tensor
from lightning.fabric.strategies.deepspeed import _format_precision_config
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.core.optimizer import _init_optimizers_and_lr_schedulers, _MockOptimizer
from lightning.pytorch.plugins.precision.deepspeed import DeepSpeedPrecision
from lightning.pytorch.strategies.ddp import DDPStrategy
from lightning.pytorch.strategies.deepspeed import DeepSpeedStrategy, remove_module_hooks
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.model_helpers import is_overridden
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from lightning_utilities import apply_to_collection
from typing_extensions import override

from hpu_nb.core import fp8, noise
from hpu_nb.core.fp8.plugin import HPUFp8Mixin
from hpu_nb.core.issues import Issue
from hpu_nb.core.mixed_precision import autocast_context
from hpu_nb.core.precision_names import unify_precision, validate_precision
from hpu_nb.core.strategies.launchers import HPUMultiProcessingLauncher
from hpu_nb.core.strategies.parallel import HPUTrainerParallelMixin
from hpu_nb.runtime import distributed as hpu_dist
from hpu_nb.runtime import get_backend
from hpu_nb.runtime.base import DeviceBackend
from hpu_nb.runtime.files import UnreadableFileError, read_small_file
from hpu_nb.runtime.generations import zero3_support

__all__ = ["HPUDeepSpeedPrecisionPlugin", "HPUDeepSpeedStrategy", "deepspeed_issues", "require_deepspeed"]

EXTRA_HINT = "pip install 'hpu_nb[deepspeed]'"
ZERO_STAGES = (0, 1, 2, 3)
OPTIMIZER_OFFLOAD_STAGES = (1, 2, 3)  # the ZeRO stages that can step the optimizer on the CPU (ZeRO-Offload)
DEEPSPEED_PRECISIONS = ("32-true", "bf16-mixed", "bf16-true", "16-mixed", "fp8")
EnginePrecision = Literal["32-true", "bf16-mixed", "bf16-true", "16-mixed"]  # Lightning's names: DeepSpeed runs one
ENGINE_PRECISIONS: tuple[EnginePrecision, ...] = ("32-true", "bf16-mixed", "bf16-true", "16-mixed")
# What DeepSpeed itself runs for a precision it has no name for: with "fp8", the fp8 layers run in fp8 autocast and
# the rest in bf16 (as autocast_dtype("fp8")): DeepSpeed's bf16 section, bf16 inputs, as for "bf16-mixed".
ENGINE_PRECISION: dict[str, EnginePrecision] = {"fp8": "bf16-mixed"}


NOT_INSTALLED = (f"DeepSpeed is not installed, and HPUDeepSpeedStrategy needs it. Install the extra: `{EXTRA_HINT}` (on"
                 " a Gaudi, install Habana's DeepSpeed fork instead, as Intel's Gaudi docs describe).")


def require_deepspeed() -> None:
    """Set DeepSpeed's environment for this device and check it is installed (clear error naming the extra)."""
    hpu_dist.prepare_deepspeed_environment()
    try:
        import deepspeed  # noqa: F401, PLC0415 -- lazy: deepspeed is optional
    except ImportError:
        raise MisconfigurationException(NOT_INSTALLED) from None


# -- the rules of a DeepSpeed configuration: written once, raised / warned by the strategy, shown by the widget -------
def deepspeed_issues(
    *,
    stage: Any = 2,
    zero_optimization: bool = True,
    offload_optimizer: bool = False,
    offload_parameters: bool = False,
    fp8_inference: bool = False,
    precision: str | None = None,
    backend: DeviceBackend | None = None,
    check_installed: bool = False,
) -> list[Issue]:
    """What is wrong with these DeepSpeed settings; each issue names the argument it concerns.

    `fp8_inference`: fp8 measure / quantize will run on the model. `precision`: the Trainer's, checked against
    DeepSpeed's accelerator (imports DeepSpeed). `backend`: check the Gaudi software release's rules for it.
    `check_installed`: say so when DeepSpeed is missing (without importing it).
    """
    issues: list[Issue] = []
    if check_installed and importlib.util.find_spec("deepspeed") is None:
        issues.append(Issue("deepspeed", NOT_INSTALLED))
        precision = None  # what DeepSpeed's accelerator supports cannot be asked
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        return [*issues, Issue("stage", f"DeepSpeed ZeRO stage {stage!r} does not exist: DeepSpeed ZeRO has stages 0,"
                                        " 1, 2 and 3 (e.g. HPUDeepSpeedStrategy(stage=2)).")]
    zero_stage = stage if zero_optimization else 0
    off = ", zero_optimization=False" if not zero_optimization else ""
    if offload_parameters and zero_stage != 3:
        issues.append(Issue("offload_parameters", (
            f"Offloading parameters with offload_parameters=True needs ZeRO stage 3, but stage is {stage}{off}. Use"
            " stage=3, or offload only the optimizer (offload_optimizer=True) with stage 1 or 2 (in a DeepSpeed"
            " config: 'offload_param' needs 'stage': 3).")))
    if offload_optimizer and zero_stage not in OPTIMIZER_OFFLOAD_STAGES:  # lightning-habana ignored it: so do we
        issues.append(Issue("offload_optimizer", (
            f"offload_optimizer=True is ignored: offloading the optimizer needs ZeRO stage 1, 2 or 3, but stage is "
            f"{stage}{off}: the optimizer stays on the device (so does a DeepSpeed config's 'offload_optimizer')."),
            "warning"))
    if fp8_inference and zero_stage == 3:  # fp8 inference reads and quantizes whole weights
        issues.append(Issue("stage", (
            "fp8 inference (measure or quantize) with DeepSpeed needs whole weights on each device, and ZeRO stage 3"
            " partitions them. Predict / test with ZeRO-0, 1 or 2 (e.g. HPUDeepSpeedStrategy(stage=2)): the stage"
            " only matters for training, and only ZeRO-3 partitions them.")))
    if backend is not None and zero_stage == 3:
        ok, reason = zero3_support(backend.generation(), backend.release())
        if not ok:
            issues.append(Issue("stage", reason, "warning"))
    if precision == "16-mixed":
        accelerator = _deepspeed_accelerator()
        if not accelerator.is_fp16_supported():
            issues.append(Issue("precision", (
                f"16-mixed with DeepSpeed: this DeepSpeed's accelerator has no fp16 (DeepSpeed's"
                f" {accelerator._name!r} accelerator); choose bf16-mixed.")))
    return issues


@functools.lru_cache(maxsize=1)
def _deepspeed_accelerator() -> Any:
    """DeepSpeed's accelerator, set up for this device (imports DeepSpeed once, only when its precision is asked)."""
    require_deepspeed()
    from deepspeed.accelerator import get_accelerator  # noqa: PLC0415 -- lazy: deepspeed is optional

    return get_accelerator()


def _apply(issues: list[Issue]) -> list[Issue]:
    """Raise the first error as MisconfigurationException, warn each warning; returns the warnings."""
    for issue in issues:
        if issue.is_error:
            raise MisconfigurationException(issue.message)
    for issue in issues:
        rank_zero_warn(issue.message)
    return issues


class HPUDeepSpeedPrecisionPlugin(HPUFp8Mixin, DeepSpeedPrecision):
    """DeepSpeed precision for HPU: "32-true", "bf16-mixed" ("bf16"), "bf16-true", "16-mixed" and "fp8" (Gaudi2+).

    With "fp8", DeepSpeed runs in bf16 (its config's bf16 section) and `convert_modules` works as
    HPUPrecisionPlugin's: replace_layers=True swaps nn.Linear for fp8 layers, whose forward runs in fp8 autocast;
    inference=True measures (quant=False) or quantizes (quant=True). The inference conversion is checked at once and
    applied when trainer.predict / test / validate has wrapped the model in DeepSpeed (as lightning-habana did), so
    DeepSpeed's bf16 cast and hook removal come before it; measurements are written at the end of predict / test.
    fp8 inference reads whole weights: not on ZeRO stage 3's partitioned ones (a clear error when predict starts).

    Args:
        precision: as above.
        device: kept for lightning-habana compatibility.
        recipe / replace_layers: as HPUPrecisionPlugin's, with precision="fp8".
    """

    def __init__(
        self, precision: str | int = "32-true", device: str = "hpu", recipe: Any = None, replace_layers: bool = False
    ) -> None:
        unified = _validate_deepspeed_precision(precision)
        super().__init__(engine_precision_of(unified))
        self.precision = unified
        self.device = device
        self._init_fp8(recipe, replace_layers)
        # inference conversions waiting for DeepSpeed's wrapping
        self._planned: list[tuple[weakref.ref[torch.nn.Module], fp8.InferencePlan]] = []
        self.inference_engine_dtype: torch.dtype | None = None  # set while deepspeed.init_inference's engine runs

    @property
    def engine_precision(self) -> EnginePrecision:
        """The precision DeepSpeed's config is written for ("bf16-mixed" for "fp8")."""
        return engine_precision_of(self.precision)

    def use_inference_engine(self, weights_dtype: torch.dtype | None) -> None:
        """Called by the strategy: the model runs in deepspeed.init_inference's engine, whose weights keep the engine's
        own dtype (its `dtype` argument), not the training config's bf16 / fp16; None: back to DeepSpeed's engine."""
        self.inference_engine_dtype = weights_dtype

    @override
    def convert_input(self, data: Any) -> Any:
        if self.inference_engine_dtype is None:
            return super().convert_input(data)  # DeepSpeed's engine casts the weights to the precision: so the inputs
        if "true" in self.precision:  # inputs in the engine's weights' dtype
            return apply_to_collection(data, function=_convert_fp_tensor, dtype=torch.Tensor,
                                       dst_type=self.inference_engine_dtype)
        return data  # "-mixed" / fp8: autocast does the casting, as HPUPrecisionPlugin's (and lightning-habana's)

    @override
    def forward_context(self) -> AbstractContextManager[Any]:
        mixed = self.inference_engine_dtype is not None and "true" not in self.precision
        if self.precision == "fp8" or mixed:  # as HPUPrecisionPlugin's: autocast on "hpu" (and fp8 autocast)
            return autocast_context(self.precision, recipe=self.recipe)
        return super().forward_context()  # DeepSpeed casts the model and the inputs itself

    @override
    def _convert_for_inference(
        self, module: torch.nn.Module, quant: bool | str | dict[str, Any], fp8_data_path: str | None
    ) -> torch.nn.Module:
        fp8.require_fp8()
        self._planned.append((weakref.ref(module), fp8.plan_inference(quant, fp8_data_path)))
        return module

    @property
    def has_planned_conversions(self) -> bool:
        """Whether fp8 inference conversions wait for DeepSpeed's wrapping."""
        return any(ref() is not None for ref, _ in self._planned)

    def apply_planned_conversions(self, root: torch.nn.Module) -> torch.nn.Module:
        """Apply the planned fp8 inference conversions of `root` (the model DeepSpeed wraps) or of its submodules;
        returns the model DeepSpeed should run (`root`, unless a Gaudi toolkit handed back a new one)."""
        waiting = []
        for ref, plan in self._planned:
            module = ref()
            if module is None:
                continue
            if module is not root and all(m is not module for m in root.modules()):
                waiting.append((ref, plan))
                continue
            converted = self._track(fp8.apply_inference(module, plan))
            if converted is not module and module is root:
                root = converted
            elif converted is not module:
                raise fp8.Fp8InferenceError(
                    f"fp8 inference returned a new {type(converted).__name__} for a submodule of the DeepSpeed model;"
                    " convert the LightningModule itself with HPUDeepSpeedPrecisionPlugin.convert_modules().")
        self._planned = waiting
        return root


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


def engine_precision_of(unified: str) -> EnginePrecision:
    """What DeepSpeed runs for a precision _validate_deepspeed_precision took: itself, or "bf16-mixed" for "fp8"."""
    engine = ENGINE_PRECISION.get(unified, unified)
    assert _is_engine_precision(engine)
    return engine


def _is_engine_precision(name: str) -> TypeGuard[EnginePrecision]:
    return name in ENGINE_PRECISIONS


def _validate_deepspeed_precision(precision: Any) -> str:
    unified = unify_precision(precision)
    if unified not in DEEPSPEED_PRECISIONS:
        raise ValueError(
            f"precision={precision!r} is not supported with DeepSpeed on HPU; choose one of:"
            f" {', '.join(DEEPSPEED_PRECISIONS)}."
        )
    if unified == "bf16-true":  # DeepSpeed's own; HPUPrecisionPlugin does not run it
        return unified
    return validate_precision(precision)  # the Gaudi generation's checks (fp16, fp8)


def _inference_keys() -> set[str]:
    """The arguments `deepspeed.init_inference` takes (its config's fields)."""
    import deepspeed  # noqa: PLC0415 -- lazy: deepspeed is optional

    return set(deepspeed.default_inference_config())


def validate_zero_config(config: dict[str, Any], backend: DeviceBackend | None = None) -> None:
    """Catch the configurations DeepSpeed would reject late or obscurely (unknown stage, misplaced offload), by
    `deepspeed_issues`; an optimizer offload at stage 0 is dropped, saying so. `backend`: its release's rules too."""
    zero = config.get("zero_optimization")
    if zero is None or zero is False:
        return
    if not isinstance(zero, dict):
        raise MisconfigurationException(f"DeepSpeed config 'zero_optimization' must be a dict, got {zero!r}.")
    warned = _apply(deepspeed_issues(stage=zero.get("stage", 0), offload_parameters=bool(zero.get("offload_param")),
                                     offload_optimizer=bool(zero.get("offload_optimizer")), backend=backend))
    if any(issue.field == "offload_optimizer" for issue in warned):
        zero.pop("offload_optimizer")


class HPUDeepSpeedStrategy(HPUTrainerParallelMixin, DeepSpeedStrategy):
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
        inference_kwargs = {key: kwargs.pop(key) for key in list(kwargs) if key in _inference_keys()}
        _apply(deepspeed_issues(stage=stage))
        if isinstance(config, dict):
            config = copy.deepcopy(config)  # Lightning fills in the config; keep the user's dict as it was
        elif isinstance(config, (str, Path)) and not os.path.exists(config):
            raise MisconfigurationException(f"DeepSpeed config file {str(config)!r} does not exist.")
        elif isinstance(config, (str, Path)):
            try:
                config = json.loads(read_small_file(config, "DeepSpeed config file"))
            except UnreadableFileError as err:
                raise MisconfigurationException(str(err)) from None
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                raise MisconfigurationException(f"DeepSpeed config file {str(config)!r} is not valid JSON: "
                                                f"{err}") from None
        if config is None:  # the arguments make the config; with ZeRO on, validate_zero_config warns about offload
            _apply(deepspeed_issues(stage=stage, zero_optimization=zero_optimization,
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

    def _refuse_fp8_inference_on_partitioned_weights(self) -> None:
        """fp8 inference reads and quantizes whole weights; ZeRO-3 leaves each device a shard outside forward."""
        plugin = self.precision_plugin
        if isinstance(plugin, HPUDeepSpeedPrecisionPlugin) and plugin.has_planned_conversions:
            _apply(deepspeed_issues(stage=3, fp8_inference=True))

    def _apply_planned_fp8_conversions(self) -> None:
        """fp8 inference conversions wait for DeepSpeed's wrapping (its bf16 cast and hook removal come first)."""
        if isinstance(self.precision_plugin, HPUDeepSpeedPrecisionPlugin):
            engine = self.model  # DeepSpeed's engine (training or inference): it runs its `module`
            assert engine is not None
            module = engine.module
            assert isinstance(module, torch.nn.Module)
            converted = self.precision_plugin.apply_planned_conversions(module)
            if converted is not module:
                engine.module = converted

    # -- environment: no "CUDA only" check; HCCL (Gaudi) or gloo (emulated) ----------------------------------------
    @override
    def setup_environment(self) -> None:
        DDPStrategy.setup_environment(self)  # skips DeepSpeedStrategy's CUDA-only check (and the mixin's, hence:)
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

    @override
    def _initialize_deepspeed_inference(self, model: Any) -> None:
        import deepspeed  # noqa: PLC0415 -- lazy: deepspeed is optional

        assert isinstance(self.config, dict)
        inference_only = {key: self.config[key] for key in _inference_keys() & set(self.config)}
        if self.inference_kwargs or inference_only:  # DeepSpeed's inference engine (tensor parallel, kernels, dtype)
            remove_module_hooks(model)
            engine = deepspeed.init_inference(model=model, config=inference_only, **self.inference_kwargs)
            self.model = engine
            self._use_inference_engine(engine.module)
            self._apply_planned_fp8_conversions()
            return
        self._use_inference_engine(None)
        if self.zero_stage_3:
            self._refuse_fp8_inference_on_partitioned_weights()
        inference_config: dict[str, Any] = {"train_micro_batch_size_per_gpu": 1}
        for key in ("fp16", "bf16"):
            if key in self.config:
                inference_config[key] = self.config[key]
        if self.zero_stage_3:
            inference_config["zero_allow_untested_optimizer"] = self.config["zero_allow_untested_optimizer"]
            inference_config["zero_optimization"] = self.config["zero_optimization"]
        remove_module_hooks(model)
        self.model, _, _, _ = deepspeed.initialize(
            args=self._deepspeed_args(), config=inference_config, model=model, optimizer=None,
            lr_scheduler=None, model_parameters=[], dist_init_required=False,
        )
        self._apply_planned_fp8_conversions()

    def _use_inference_engine(self, module: torch.nn.Module | None) -> None:
        """Tell the precision plugin whether the inference engine runs `module`, and in which dtype its weights are."""
        plugin = self.precision_plugin
        if isinstance(plugin, HPUDeepSpeedPrecisionPlugin):
            dtypes = [p.dtype for p in module.parameters() if p.is_floating_point()] if module is not None else []
            plugin.use_inference_engine(dtypes[0] if dtypes else (torch.float32 if module is not None else None))

    def _deepspeed_args(self) -> Any:
        """Lightning passes the CUDA device index; an HPU (or emulated) process is named by its local rank."""
        return argparse.Namespace(device_rank=self.local_rank)

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

"""DeepSpeed's inference engine for validate / test / predict (`deepspeed.init_inference`: tensor parallel, kernel
injection, its own dtype), as lightning-habana ran it, and the fp8 inference conversions applied once DeepSpeed has
wrapped the model. A mixin of HPUDeepSpeedStrategy (deepspeed.py)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.strategies.deepspeed import remove_module_hooks
from typing_extensions import override

from hpu_nb.core.strategies.deepspeed_config import apply_issues, deepspeed_issues, inference_keys
from hpu_nb.core.strategies.deepspeed_precision import HPUDeepSpeedPrecisionPlugin

if TYPE_CHECKING:
    from lightning.pytorch.strategies.deepspeed import DeepSpeedStrategy as DeepSpeedStrategyHost
else:
    DeepSpeedStrategyHost = object  # a base for the type checker only: the Lightning strategy it is mixed into

__all__ = ["DeepSpeedInferenceMixin"]


class DeepSpeedInferenceMixin(DeepSpeedStrategyHost):
    """Put before Lightning's DeepSpeedStrategy: `inference_kwargs` (deepspeed.init_inference's arguments, given to the
    strategy or in its config) make evaluation run in DeepSpeed's inference engine; fp8 inference conversions wait
    for DeepSpeed's wrapping."""

    inference_kwargs: dict[str, Any]

    @override
    def _initialize_deepspeed_inference(self, model: Any) -> None:
        import deepspeed  # noqa: PLC0415 -- lazy: deepspeed is optional

        assert isinstance(self.config, dict)
        inference_only = {key: self.config[key] for key in inference_keys() & set(self.config)}
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

    def _refuse_fp8_inference_on_partitioned_weights(self) -> None:
        """fp8 inference reads and quantizes whole weights; ZeRO-3 leaves each device a shard outside forward."""
        plugin = self.precision_plugin
        if isinstance(plugin, HPUDeepSpeedPrecisionPlugin) and plugin.has_planned_conversions:
            apply_issues(deepspeed_issues(stage=3, fp8_inference=True))

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

    def _deepspeed_args(self) -> Any:
        """Lightning passes the CUDA device index; an HPU (or emulated) process is named by its local rank."""
        return argparse.Namespace(device_rank=self.local_rank)

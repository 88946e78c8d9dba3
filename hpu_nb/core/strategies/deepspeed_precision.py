"""HPUDeepSpeedPrecisionPlugin: DeepSpeed's precision on HPU, fp8 included (DeepSpeed runs the rest in bf16), with the
fp8 inference conversions that wait for DeepSpeed's wrapping."""

from __future__ import annotations

import weakref
from contextlib import AbstractContextManager
from typing import Any, Literal, TypeGuard

import torch
from lightning.fabric.plugins.precision.utils import _convert_fp_tensor
from lightning.pytorch.plugins.precision.deepspeed import DeepSpeedPrecision
from lightning_utilities import apply_to_collection
from typing_extensions import override

from hpu_nb.core import fp8
from hpu_nb.core.fp8.plugin import HPUFp8Mixin
from hpu_nb.core.mixed_precision import autocast_context
from hpu_nb.core.precision_names import unify_precision, validate_precision

__all__ = ["DEEPSPEED_PRECISIONS", "ENGINE_PRECISIONS", "EnginePrecision", "HPUDeepSpeedPrecisionPlugin",
           "engine_precision_of"]

DEEPSPEED_PRECISIONS = ("32-true", "bf16-mixed", "bf16-true", "16-mixed", "fp8")
EnginePrecision = Literal["32-true", "bf16-mixed", "bf16-true", "16-mixed"]  # Lightning's names: DeepSpeed runs one
ENGINE_PRECISIONS: tuple[EnginePrecision, ...] = ("32-true", "bf16-mixed", "bf16-true", "16-mixed")
# What DeepSpeed itself runs for a precision it has no name for: with "fp8", the fp8 layers run in fp8 autocast and
# the rest in bf16 because DeepSpeed's engine holds bf16 weights (its bf16 section, bf16 inputs, as for "bf16-mixed").
ENGINE_PRECISION: dict[str, EnginePrecision] = {"fp8": "bf16-mixed"}


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

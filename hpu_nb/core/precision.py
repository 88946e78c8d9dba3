"""HPUPrecisionPlugin: mixed precision on Gaudi for the Trainer, real or emulated.

As Lightning builds its Trainer precisions (`TransformerEnginePrecision(Precision, FabricTEPrecision)`), this is
Fabric's `HPUPrecision` (hpu_nb.core.fabric.precision: autocast on "hpu" with Habana's op lists, fp8, the loss scaler
of "16-mixed") with the Trainer's hooks only: the loss scaler around Lightning's closure (scale before backward,
unscale before the gradient-clipping hooks, a step skipped on inf / nan).

Precisions: "32-true" ("32"), "bf16-mixed" ("bf16"), "16-mixed" and "fp8" (the last two from Gaudi2 on); the names,
aliases and float dtypes live in hpu_nb.core.precision_names, the forward context and the scaler in
hpu_nb.core.mixed_precision, fp8 in hpu_nb.core.fp8. The names below are re-exported here, where users import them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.utilities import GradClipAlgorithmType
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import Tensor
from torch.optim import LBFGS
from typing_extensions import override

from hpu_nb.core.fabric.precision import HPUPrecision
from hpu_nb.core.fp8.plugin import HPUFp8Mixin
from hpu_nb.core.mixed_precision import autocast_context, autocast_device_type, hpu_autocast, optimizer_unscales_itself
from hpu_nb.core.precision_names import (
    PLUGIN_PRECISIONS,
    PRECISION_ALIASES,
    PRECISION_CHOICES,
    UnsupportedPrecisionError,
    autocast_dtype,
    unify_precision,
    validate_precision,
)

__all__ = [
    "PLUGIN_PRECISIONS",
    "PRECISION_ALIASES",
    "PRECISION_CHOICES",
    "HPUFp8Mixin",
    "HPUPrecisionPlugin",
    "UnsupportedPrecisionError",
    "autocast_context",
    "autocast_device_type",
    "autocast_dtype",
    "hpu_autocast",
    "unify_precision",
    "validate_precision",
]


# [misc]: the Trainer's Precision.backward (which wins here: the scaler acts in pre_backward) narrows Fabric's signature
# (model: LightningModule, an optimizer argument), under Lightning's own `type: ignore[override]`.
class HPUPrecisionPlugin(Precision, HPUPrecision):  # type: ignore[misc]
    """Mixed precision for HPU: bf16 / fp16 autocast with Habana-style op lists, fp8 training / inference, and a loss
    scaler for "16-mixed". The arguments are HPUPrecision's (hpu_nb.core.fabric.precision):

    Args:
        precision: "32-true" / "32", "bf16-mixed" / "bf16", "16-mixed" (Gaudi2+), "fp8" (Gaudi2+).
        device: kept for lightning-habana compatibility; autocast always uses the backend's device type.
        recipe: fp8 recipe (hpu_nb.core.fp8.DelayedScaling, Habana's te.recipe.DelayedScaling, or a dict).
        replace_layers: with precision="fp8", trainer.fit (or convert_modules()) swaps nn.Linear for fp8 layers.
        lower_list / fp32_list: op-list file path or op names, replacing Habana's default list.
        bf16_file_path / fp32_file_path / opt_level / verbose / hmp_params: HMP-era arguments, still read.
        scaler: a torch.amp.GradScaler for "16-mixed" (default: one on "hpu").
        bf16_autocast: with "fp8", bf16 autocast around the fp8 layers too (default: fp8_autocast only, the rest fp32,
            as lightning-habana).
    """

    # -- the loss scaler of "16-mixed" around Lightning's closure (as Lightning's MixedPrecision) ------------------
    @override
    def pre_backward(self, tensor: Tensor, module: Any) -> Tensor:
        if self.scaler is not None:
            tensor = self.scaler.scale(tensor)
        return super().pre_backward(tensor, module)

    @override
    def optimizer_step(  # type: ignore[override]  # the Trainer's signature: Lightning widens Fabric's (its ignore)
        self, optimizer: Any, model: Any, closure: Callable[[], Any], **kwargs: Any
    ) -> Any:
        if self.scaler is None:
            return super().optimizer_step(optimizer, model=model, closure=closure, **kwargs)
        if isinstance(optimizer, LBFGS):
            raise MisconfigurationException("precision='16-mixed' (a loss scaler) and the LBFGS optimizer do not mix.")
        closure_result = closure()
        skip_unscaling = closure_result is None and model.automatic_optimization  # backward was skipped
        if not optimizer_unscales_itself(optimizer) and not skip_unscaling:
            self.scaler.unscale_(optimizer)  # before on_before_optimizer_step and gradient clipping
        self._after_closure(model, optimizer)
        if skip_unscaling:
            return closure_result
        step_output = self.scaler.step(optimizer, **kwargs)  # skipped when the gradients hold inf / nan
        self.scaler.update()
        return step_output

    @override
    def clip_gradients(
        self,
        optimizer: Any,
        clip_val: int | float = 0.0,
        gradient_clip_algorithm: GradClipAlgorithmType = GradClipAlgorithmType.NORM,
    ) -> None:
        if clip_val > 0 and self.scaler is not None and optimizer_unscales_itself(optimizer):
            raise RuntimeError(
                f"{type(optimizer).__qualname__} unscales the gradients inside its step: they cannot be clipped"
                " with precision='16-mixed'."
            )
        super().clip_gradients(optimizer=optimizer, clip_val=clip_val, gradient_clip_algorithm=gradient_clip_algorithm)

"""Fabric's HPU precision plugins: `HPUPrecision`, the one implementation of HPU precision, and `HPUFSDPPrecision`.

As Lightning builds its precisions (`TransformerEnginePrecision(Precision, FabricTEPrecision)`), the Fabric class holds
the work and the Trainer's `HPUPrecisionPlugin(Precision, HPUPrecision)` (hpu_nb.core.precision) adds only the
Trainer's hooks: the precision names and the Gaudi-generation checks (hpu_nb.core.precision_names), autocast on "hpu"
with Habana's op lists, fp8 (`convert_module` during set-up, `convert_modules`), and the loss scaler of "16-mixed"
(hpu_nb.core.mixed_precision). FSDP's precision is the shared `HPUFSDPPrecisionMixin`
(hpu_nb.core.strategy_parts.fsdp) on Fabric's FSDPPrecision: Lightning's two FSDPPrecision classes do not share a
base.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

import torch
from lightning.fabric.plugins.precision import Precision
from lightning.fabric.plugins.precision.fsdp import FSDPPrecision
from lightning.fabric.utilities.rank_zero import rank_zero_info
from torch.nn import Module
from typing_extensions import override

from hpu_nb.core.fp8.plugin import HPUFp8Mixin
from hpu_nb.core.mixed_precision import autocast_context, loss_scaler, optimizer_unscales_itself
from hpu_nb.core.oplists import OpListSource, apply_op_lists, load_op_lists, shadowed_fp32_ops
from hpu_nb.core.precision_names import validate_precision
from hpu_nb.core.strategy_parts.fsdp import HPUFSDPPrecisionMixin
from hpu_nb.core.user_warnings import warn_at_user_code
from hpu_nb.runtime.autocast_lists import DEFAULT_LOWER_OPS

__all__ = ["HPUFSDPPrecision", "HPUPrecision"]

_HMP_KEYS = ("level", "verbose", "bf16_ops", "fp32_ops")


class HPUPrecision(HPUFp8Mixin, Precision):
    """Mixed precision on HPU (Fabric; the Trainer's HPUPrecisionPlugin is this with the Trainer's hooks): bf16 / fp16
    autocast with Habana-style op lists, fp8 training / inference, and a loss scaler for "16-mixed".

    Args:
        precision: "32-true" / "32", "bf16-mixed" / "bf16", "16-mixed" (Gaudi2+), "fp8" (Gaudi2+).
        device: kept for lightning-habana compatibility; autocast always uses the backend's device type.
        recipe: fp8 recipe (hpu_nb.core.fp8.DelayedScaling, Habana's te.recipe.DelayedScaling, or a dict).
        replace_layers: with precision="fp8", nn.Linear layers become fp8 layers when the model is set up
            (`trainer.fit`, `fabric.setup`), or at convert_modules().
        lower_list / fp32_list: op-list file path or op names, replacing Habana's default list (the device reads the
            variables PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST / PT_HPU_AUTOCAST_FP32_OPS_LIST; on a Gaudi, set them
            before Python starts instead: Habana reads them when it loads).
        bf16_file_path / fp32_file_path / opt_level / verbose / hmp_params: HMP-era arguments, still read.
        scaler: an HPUGradScaler for "16-mixed" (default: one on "hpu"; hpu_nb.core.mixed_precision says why; torch's
            own GradScaler is taken with a warning: it calls ops a Gaudi has no kernel for).
        bf16_autocast: with precision="fp8", also run bf16 autocast around the forward, so the ops outside the fp8
            layers compute in bf16 (faster on a Gaudi's bf16 units, less exact; benchmarks/bench_fp8.py measures
            both). Default False: lightning-habana's fp8, the transformer engine's fp8_autocast only, the rest fp32.
    """

    def __init__(
        self,
        precision: str | int = "32-true",
        device: str = "hpu",
        recipe: Any = None,
        replace_layers: bool = False,
        *,
        lower_list: OpListSource = None,
        fp32_list: OpListSource = None,
        bf16_file_path: str | None = None,
        fp32_file_path: str | None = None,
        opt_level: str | None = None,
        verbose: bool = False,
        hmp_params: Mapping[str, Any] | None = None,
        scaler: torch.amp.GradScaler | None = None,
        bf16_autocast: bool = False,
    ) -> None:
        # Lightning's name for it ("bf16" -> "bf16-mixed"), which every rule here reads; `precision` keeps the name the
        # user wrote, as lightning-habana's plugin did (`trainer.precision == "bf16"` stays True; unify_precision
        # maps either spelling to the same name)
        self.unified_precision = validate_precision(precision)
        self.precision = precision if isinstance(precision, str) else self.unified_precision
        self.device = device
        self.scaler = loss_scaler(self.unified_precision, scaler)
        if bf16_autocast and self.unified_precision != "fp8":
            raise ValueError(f"bf16_autocast=True is for precision='fp8' (bf16 autocast around the fp8 layers), not"
                             f" {precision!r}: for bf16 autocast alone, use precision='bf16-mixed'.")
        self.bf16_autocast = bool(bf16_autocast)
        lower_list = _seed_alias("bf16_file_path", bf16_file_path, "lower_list", lower_list)
        fp32_list = _seed_alias("fp32_file_path", fp32_file_path, "fp32_list", fp32_list)
        if hmp_params is not None:
            opt_level, verbose, lower_list, fp32_list = _read_hmp_params(
                hmp_params, opt_level, verbose, lower_list, fp32_list
            )
        if opt_level is not None and str(opt_level).upper() != "O1":
            raise ValueError(
                f"opt_level={opt_level!r} is not supported: autocast works like HMP's 'O1' (per-op casting). "
                "Drop opt_level, or pass 'O1'."
            )
        self.verbose = bool(verbose)
        self.op_lists = load_op_lists(lower_list, fp32_list)
        if self.op_lists:
            self._use_op_lists()
        self._init_fp8(recipe, replace_layers)

    def _use_op_lists(self) -> None:
        """Make the given lists the device's (process-wide, as on a Gaudi); refuse where they cannot take effect."""
        shadowed = shadowed_fp32_ops(self.op_lists, DEFAULT_LOWER_OPS)
        if shadowed:
            warn_at_user_code(  # shown at the user's line that built the plugin, not at this one
                f"fp32_list names {shadowed}, which the lower-precision list in force (Habana's default) also names;"
                " Habana checks the lower list first, so they still run in the lower precision. Pass lower_list= too."
            )
        in_force, note = apply_op_lists(self.op_lists)
        if not in_force:
            raise RuntimeError(f"{type(self).__name__}(lower_list=..., fp32_list=...): {note}")
        if note:
            warn_at_user_code(f"{type(self).__name__}: {note}.")
        if self.verbose:
            rank_zero_info(f"{type(self).__name__}({self.precision!r}): autocast {self.op_lists!r}")

    # -- forward -----------------------------------------------------------------------------------------------
    def autocast_context_manager(self) -> AbstractContextManager[None]:
        """The context every forward (Fabric) / training, evaluation and predict step (Trainer) runs in."""
        return autocast_context(self.unified_precision, recipe=self.recipe, bf16_autocast=self.bf16_autocast)

    @override
    def forward_context(self) -> AbstractContextManager[None]:
        return self.autocast_context_manager()

    # -- the loss scaler of "16-mixed": Fabric's hooks (the Trainer's are in HPUPrecisionPlugin) -------------------
    @override
    def backward(self, tensor: torch.Tensor, model: Module | None, *args: Any, **kwargs: Any) -> None:
        if self.scaler is not None:
            tensor = self.scaler.scale(tensor)
        super().backward(tensor, model, *args, **kwargs)

    @override
    def optimizer_step(self, optimizer: Any, **kwargs: Any) -> Any:
        if self.scaler is None:
            return super().optimizer_step(optimizer, **kwargs)
        step_output = self.scaler.step(optimizer, **kwargs)  # skipped when the gradients hold inf / nan
        self.scaler.update()
        return step_output

    @override
    def unscale_gradients(self, optimizer: Any) -> None:
        if self.scaler is not None:
            if optimizer_unscales_itself(optimizer):
                raise NotImplementedError("Gradient clipping is not implemented for optimizers handling the unscaling.")
            self.scaler.unscale_(optimizer)

    @override
    def state_dict(self) -> dict[str, Any]:
        return self.scaler.state_dict() if self.scaler is not None else {}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.scaler is not None:
            self.scaler.load_state_dict(state_dict)

    def __repr__(self) -> str:
        lists = f", {self.op_lists!r}" if self.op_lists else ""
        return f"{type(self).__name__}(precision={self.precision!r}{lists})"


class HPUFSDPPrecision(HPUFSDPPrecisionMixin, FSDPPrecision):
    """FSDP precision for Fabric on HPU: "32-true", "bf16-mixed", "bf16-true", "16-mixed", "16-true" (fp16: Gaudi2+)."""

    def __init__(self, precision: str | int = "32-true", device: str = "hpu", scaler: Any = None) -> None:
        self._init_fsdp_precision(precision, scaler)
        self.device = device

    @classmethod
    def from_plugin(cls, plugin: Any) -> HPUFSDPPrecision:
        """This plugin, or the same precision from one of hpu_nb's other precision plugins (e.g. the Trainer's)."""
        if isinstance(plugin, cls):
            return plugin
        # HPUPrecisionPlugin is an HPUPrecision, the Trainer's HPUFSDPPrecision an HPUFSDPPrecisionMixin
        if isinstance(plugin, HPUPrecision):
            return cls(plugin.unified_precision)
        if isinstance(plugin, HPUFSDPPrecisionMixin):
            return cls(plugin.precision)
        raise TypeError(f"HPUFSDPStrategy works with HPUFSDPPrecision, got {type(plugin).__name__}.")

    def __repr__(self) -> str:
        return f"HPUFSDPPrecision(precision={self.precision!r})"


def _seed_alias(old: str, old_value: Any, new: str, new_value: Any) -> Any:
    if old_value is None:
        return new_value
    if new_value is not None:
        raise ValueError(f"Pass either {old}= or {new}=, not both.")
    warnings.warn(
        f"HPUPrecisionPlugin({old}=...) comes from the HMP era; it is read as {new}= (an autocast op list).",
        DeprecationWarning,
        stacklevel=3,
    )
    return old_value


def _read_hmp_params(
    hmp_params: Mapping[str, Any], opt_level: Any, verbose: bool, bf16: Any, fp32: Any
) -> tuple[Any, bool, Any, Any]:
    unknown = sorted(set(hmp_params) - set(_HMP_KEYS))
    if unknown:
        raise ValueError(f"hmp_params has unknown keys {unknown}; known keys: {', '.join(_HMP_KEYS)}.")
    warnings.warn(
        "hmp_params is deprecated: Habana Mixed Precision (HMP) was replaced by autocast. Its 'bf16_ops' / 'fp32_ops'"
        " files are read as lower_list= / fp32_list=; 'level' must be 'O1'.",
        DeprecationWarning,
        stacklevel=3,
    )
    return (
        hmp_params.get("level", opt_level),
        bool(hmp_params.get("verbose") or verbose),
        hmp_params.get("bf16_ops") or bf16,
        hmp_params.get("fp32_ops") or fp32,
    )

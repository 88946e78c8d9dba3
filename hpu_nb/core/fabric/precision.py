"""Fabric's HPU precision plugins: `HPUPrecision` and `HPUFSDPPrecision`, adapters of the Trainer's rules.

The precision names, the Gaudi-generation checks and the forward context (autocast on "hpu" with Habana's op lists,
fp8) are those of `HPUPrecisionPlugin` (`validate_precision`, `autocast_context`); FSDP's are those of the Trainer's
`HPUFSDPPrecision` (strategies/fsdp.py). Fabric needs its own classes only because its Precision base differs.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from lightning.fabric.plugins.precision import Precision
from lightning.fabric.plugins.precision.fsdp import FSDPPrecision
from typing_extensions import override

from hpu_nb.core.precision import autocast_context, validate_precision
from hpu_nb.core.strategies.fsdp import HPUFSDPPrecisionMixin, validate_fsdp_precision

__all__ = ["HPUFSDPPrecision", "HPUPrecision"]


class HPUPrecision(Precision):
    """Mixed precision for Fabric on HPU: "32-true" (default), "bf16-mixed", "16-mixed" and "fp8" (Gaudi2+).

    `device` is kept for lightning-habana compatibility; autocast always runs on "hpu".
    """

    def __init__(self, precision: str | int = "32-true", device: str = "hpu") -> None:
        self.precision = validate_precision(precision)  # type: ignore[assignment]
        self.device = device

    @override
    def forward_context(self) -> AbstractContextManager:
        return autocast_context(self.precision)

    def __repr__(self) -> str:
        return f"HPUPrecision(precision={self.precision!r})"


class HPUFSDPPrecision(HPUFSDPPrecisionMixin, FSDPPrecision):
    """FSDP precision for Fabric on HPU: "32-true", "bf16-mixed", "bf16-true", "16-mixed", "16-true" (fp16: Gaudi2+)."""

    def __init__(self, precision: str | int = "32-true", device: str = "hpu", scaler: Any = None) -> None:
        super().__init__(validate_fsdp_precision(precision), scaler=scaler)  # type: ignore[arg-type]
        self.device = device

    @classmethod
    def from_plugin(cls, plugin: Any) -> HPUFSDPPrecision:
        """This plugin, or the same precision from one of hpu_nb's other precision plugins (e.g. the Trainer's)."""
        if isinstance(plugin, cls):
            return plugin
        from hpu_nb.core.precision import HPUPrecisionPlugin
        from hpu_nb.core.strategies.fsdp import HPUFSDPPrecision as TrainerFSDPPrecision

        if isinstance(plugin, (HPUPrecision, HPUPrecisionPlugin, TrainerFSDPPrecision)):
            return cls(plugin.precision)
        raise TypeError(f"HPUFSDPStrategy works with HPUFSDPPrecision, got {type(plugin).__name__}.")

    def __repr__(self) -> str:
        return f"HPUFSDPPrecision(precision={self.precision!r})"

"""What mixed precision means on HPU: the forward context (autocast on "hpu", fp8 autocast) and the loss scaler.

One home for every HPU precision plugin (HPUPrecision, HPUPrecisionPlugin, the DeepSpeed and FSDP ones, Trainer and
Fabric alike).

Loss scaling, decided with evidence: "16-mixed" brings a GradScaler, as Lightning's MixedPrecision("16-mixed") does.
float16's range is the format's, not the device's: a gradient below 2**-24 (6e-8) flushes to zero on a Gaudi2/3 as
on any device. Measured on the emulated Gaudi2 (a nearly fitted 64-wide MLP, fp16 autocast, loss gradients ~5e-8):
without scaling 6-13% of the weight gradients are exactly zero and the first layer's are 87-100% wrong against
float32; with the scaler (HPUGradScaler, 2**16) none is zero and all are within 5.4e-4 (relative error; the same
numbers as torch.amp.GradScaler's, bit for bit: tests/core/test_precision_lightning_way.py,
tests/emulator/test_hpu_grad_scaler.py). Habana's GPU-migration layer turns torch.cuda.amp.GradScaler off only because
it runs CUDA's fp16 code in bfloat16, whose range is float32's; lightning-habana's "16-mixed" ran float16 autocast with
no scaler at all.

The scaler is `HPUGradScaler` (FSDP: `HPUShardedGradScaler`), not torch.amp.GradScaler: torch's unscales and updates
the scale with `aten::_amp_foreach_non_finite_check_and_unscale_` and `aten::_amp_update_scale_`, which Habana's
bridge has no HPU kernel for (hpu_nb.emulator.hpu_device.missing_kernels: the emulated Gaudi refuses them too).
HPUGradScaler does the same arithmetic with plain tensor ops, on the device, and gives the same numbers.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import defaultdict
from collections.abc import Generator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.amp.grad_scaler import _refresh_per_optimizer_state
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from typing_extensions import override

from hpu_nb.core.fp8 import fp8_autocast
from hpu_nb.core.precision_names import autocast_dtype
from hpu_nb.runtime import get_backend

__all__ = [
    "HPUGradScaler",
    "HPUShardedGradScaler",
    "autocast_context",
    "autocast_device_type",
    "hpu_autocast",
    "loss_scaler",
    "non_finite_check_and_unscale_",
    "optimizer_unscales_itself",
    "update_scale_",
]


def autocast_device_type() -> str:
    """The `device_type` for torch.autocast: "hpu", on a Gaudi and on the emulated Gaudi alike."""
    return get_backend().autocast_device_type


@contextlib.contextmanager
def hpu_autocast(
    dtype: torch.dtype = torch.bfloat16,
    enabled: bool = True,
    *,
    cache_enabled: bool | None = None,
) -> Generator[None, None, None]:
    """torch.autocast on the device type of the HPU ("hpu", on a Gaudi and on the emulated Gaudi alike).

    Works as a context manager and as a decorator. The op lists in force are the device's (hpu_nb.core.oplists).
    """
    with torch.autocast(autocast_device_type(), dtype=dtype, enabled=enabled, cache_enabled=cache_enabled):
        yield


@contextlib.contextmanager
def autocast_context(precision: str, *, recipe: Any = None, bf16_autocast: bool = False
                     ) -> Generator[None, None, None]:
    """The forward context for a unified precision: autocast on "hpu" for "-mixed"; for "fp8" the transformer engine's
    fp8_autocast only (lightning-habana's), plus bf16 autocast around it with `bf16_autocast=True`. Cached casts are
    off on HPU."""
    dtype = autocast_dtype(precision)
    if precision == "fp8" and bf16_autocast:
        dtype = torch.bfloat16
    with contextlib.ExitStack() as stack:
        if dtype is not None:
            stack.enter_context(torch.autocast(autocast_device_type(), dtype=dtype, cache_enabled=False))
        if precision == "fp8":
            stack.enter_context(fp8_autocast(enabled=True, recipe=recipe))
        yield


# -- the loss scaler: torch.amp.GradScaler's arithmetic in tensor ops Habana implements ------------------------------
def non_finite_check_and_unscale_(grads: Sequence[torch.Tensor], found_inf: torch.Tensor,
                                  inv_scale: torch.Tensor) -> None:
    """What `aten::_amp_foreach_non_finite_check_and_unscale_` does, for gradients on one device: each gradient is
    multiplied by `inv_scale` in place (in float32 for float16 / bfloat16 ones, rounded once, as the CPU / CUDA
    kernels compute), and `found_inf` (1 element) becomes 1.0 if any holds inf or nan, else is left as it is."""
    if not grads:
        return
    all_finite = torch.isfinite(grads[0]).all()
    for grad in grads[1:]:
        all_finite = torch.logical_and(all_finite, torch.isfinite(grad).all())
    found_inf.copy_(torch.where(all_finite, found_inf, 1.0))
    for grad in grads:
        if grad.dtype in (torch.float32, torch.float64):
            grad.mul_(inv_scale)
        else:
            grad.copy_(grad.float().mul_(inv_scale))


def update_scale_(scale: torch.Tensor, growth_tracker: torch.Tensor, found_inf: torch.Tensor, growth_factor: float,
                  backoff_factor: float, growth_interval: int) -> None:
    """What `aten::_amp_update_scale_` does, on the device: after a step with inf / nan (`found_inf` nonzero) the
    scale is multiplied by `backoff_factor` and the tracker of steps without inf is reset; after `growth_interval`
    such steps in a row it is multiplied by `growth_factor` (unless that overflows float32) and the tracker reset.
    The products are taken in float64 and rounded to float32, as the kernels do."""
    found = found_inf.ne(0).any()
    successful = growth_tracker + 1
    grows = torch.logical_and(found.logical_not(), successful == growth_interval)
    wide = scale.double()
    grown = (wide * growth_factor).float()
    grown = torch.where(torch.isfinite(grown), grown, scale)
    backed_off = (wide * backoff_factor).float()
    scale.copy_(torch.where(found, backed_off, torch.where(grows, grown, scale)))
    growth_tracker.copy_(torch.where(torch.logical_or(found, grows), 0, successful))


class HPUGradScaler(torch.amp.GradScaler):
    """torch.amp.GradScaler for HPU: the same scaling, skipped steps and scale updates, computed with tensor ops a
    Gaudi has kernels for (torch's calls two ATen ops Habana's bridge lacks; hpu_nb.core.mixed_precision says more).

    The default scaler of precision "16-mixed" (Trainer and Fabric); pass one to set its parameters, e.g.
    `HPUPrecisionPlugin("16-mixed", scaler=HPUGradScaler(init_scale=2.0**12))`.
    """

    def __init__(
        self,
        device: str = "hpu",
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ) -> None:
        super().__init__(
            device,
            init_scale=init_scale,
            growth_factor=growth_factor,
            backoff_factor=backoff_factor,
            growth_interval=growth_interval,
            enabled=enabled,
        )

    @override
    def _unscale_grads_(
        self,
        optimizer: torch.optim.Optimizer,
        inv_scale: torch.Tensor,
        found_inf: torch.Tensor,
        allow_fp16: bool = True,
    ) -> dict[torch.device, torch.Tensor]:
        """Unscale the optimizer's gradients and check them for inf / nan, per device (torch's loop, its kernel
        replaced by non_finite_check_and_unscale_); returns each device's found_inf."""
        by_device_and_dtype: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
        with torch.no_grad():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    if param.grad is None:
                        continue
                    if not allow_fp16 and param.grad.dtype == torch.float16:
                        raise ValueError("Attempting to unscale FP16 gradients.")
                    if param.grad.is_sparse:  # duplicate indices are summed first: the sum may overflow float16
                        if param.grad.dtype == torch.float16:
                            param.grad = param.grad.float().coalesce().half()  # CPU has no float16 coalesce
                        to_unscale = param.grad._values()
                    else:
                        to_unscale = param.grad
                    by_device_and_dtype[to_unscale.device, to_unscale.dtype].append(to_unscale)
            found_infs: dict[torch.device, torch.Tensor] = {}
            inv_scales: dict[torch.device, torch.Tensor] = {}
            for (device, _), grads in by_device_and_dtype.items():
                if device not in found_infs:
                    found_infs[device] = found_inf.to(device, copy=True)
                    inv_scales[device] = inv_scale.to(device, copy=True)
                non_finite_check_and_unscale_(grads, found_infs[device], inv_scales[device])
        return found_infs

    @override
    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        """torch's update, its kernel replaced by update_scale_ (a new scale given by the caller is torch's path)."""
        if not self._enabled or new_scale is not None:
            super().update(new_scale)
            return
        scale, growth_tracker = self._check_scale_growth_tracker("update")
        found_infs = [
            found_inf.to(scale.device)
            for state in self._per_optimizer_states.values()
            for found_inf in state["found_inf_per_device"].values()
        ]
        if not found_infs:
            raise AssertionError("No inf checks were recorded prior to update.")
        combined = found_infs[0]
        for found_inf in found_infs[1:]:
            combined = combined + found_inf
        update_scale_(scale, growth_tracker, combined, self._growth_factor, self._backoff_factor, self._growth_interval)
        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)


class HPUShardedGradScaler(HPUGradScaler, ShardedGradScaler):
    """FSDP's ShardedGradScaler for HPU: found_inf is all-reduced across the ranks (ShardedGradScaler.unscale_), the
    unscale / inf check / scale update are HPUGradScaler's."""

    def __init__(
        self,
        device: str = "hpu",
        init_scale: float = 2.0**16,
        backoff_factor: float = 0.5,
        growth_factor: float = 2.0,
        growth_interval: int = 2000,
        enabled: bool = True,
        process_group: dist.ProcessGroup | None = dist.group.WORLD,
    ) -> None:
        super().__init__(
            device,
            init_scale=init_scale,
            growth_factor=growth_factor,
            backoff_factor=backoff_factor,
            growth_interval=growth_interval,
            enabled=enabled,
        )
        if self._enabled:
            self.process_group = process_group

    @override
    def _unscale_grads_(
        self,
        optimizer: torch.optim.Optimizer,
        inv_scale: torch.Tensor,
        found_inf: torch.Tensor,
        allow_fp16: bool = True,
    ) -> dict[torch.device, torch.Tensor]:
        """One found_inf, on the scale's device, for ShardedGradScaler.unscale_ to all-reduce: a rank without a
        gradient shard still takes part, and gradients offloaded to the CPU are folded in here (torch would copy
        back with `_foreach_copy_`, which Habana's bridge has no HPU kernel for either)."""
        per_device = super()._unscale_grads_(optimizer, inv_scale, found_inf, allow_fp16)
        scale, _ = self._check_scale_growth_tracker("unscale_")
        combined = per_device.pop(scale.device, None)
        if combined is None:
            combined = found_inf.to(scale.device, copy=True)
        for other in per_device.values():
            combined = torch.maximum(combined, other.to(scale.device))
        return {scale.device: combined}


def loss_scaler(precision: str, scaler: Any = None, *, sharded: bool = False) -> Any:
    """The loss scaler of a unified precision: the given one, else an HPUGradScaler on "hpu" for "16-mixed" (an
    HPUShardedGradScaler with `sharded`, for FSDP), else None. A scaler with any other precision is refused, as
    Lightning does; torch's own GradScaler on "hpu" is taken with a warning (it fails on a Gaudi)."""
    if scaler is not None:
        if precision != "16-mixed":
            raise ValueError(f"precision={precision!r} does not use a scaler, found {scaler}.")
        _warn_if_torch_scaler_on_hpu(scaler)
        return scaler
    if precision != "16-mixed":
        return None
    if sharded:
        return HPUShardedGradScaler(device=autocast_device_type())
    return HPUGradScaler(autocast_device_type())


def _warn_if_torch_scaler_on_hpu(scaler: Any) -> None:
    """torch.amp.GradScaler (not HPUGradScaler) on "hpu" would fail at its first unscale on a Gaudi: say so now."""
    if (
        isinstance(scaler, torch.amp.GradScaler)
        and not isinstance(scaler, HPUGradScaler)
        and scaler.is_enabled()
        and getattr(scaler, "_device", None) == "hpu"
    ):
        warnings.warn(
            f"{type(scaler).__name__} on 'hpu' unscales and updates its scale with ATen ops Habana's bridge has no HPU"
            " kernel for (aten::_amp_foreach_non_finite_check_and_unscale_, aten::_amp_update_scale_): it fails on a"
            " Gaudi. Use hpu_nb.HPUGradScaler (hpu_nb.core.mixed_precision.HPUShardedGradScaler for FSDP).",
            UserWarning,
            stacklevel=4,  # the caller of HPUPrecision(...) / HPUPrecisionPlugin(...)
        )


def optimizer_unscales_itself(optimizer: Any) -> bool:
    """Whether the optimizer unscales the gradients in its own step (torch's fused optimizers): no clipping then."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))

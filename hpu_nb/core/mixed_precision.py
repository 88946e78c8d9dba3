"""What mixed precision means on HPU: the forward context (autocast on "hpu", fp8 autocast) and the loss scaler.

One home for every HPU precision plugin (HPUPrecision, HPUPrecisionPlugin, the DeepSpeed and FSDP ones, Trainer and
Fabric alike).

Loss scaling, decided with evidence: "16-mixed" brings a GradScaler, as Lightning's MixedPrecision("16-mixed") does.
float16's range is the format's, not the device's: a gradient below 2**-24 (6e-8) flushes to zero on a Gaudi2/3 as
on any device. Measured on the emulated Gaudi2 (a nearly fitted 64-wide MLP, fp16 autocast, loss gradients ~5e-8):
without scaling 6-13% of the weight gradients are exactly zero and the first layer's are 87-100% wrong against
float32; with torch.amp.GradScaler("hpu") none is zero and all are within 5e-4 (tests/test_precision_lightning_way.py).
Habana's GPU-migration layer turns torch.cuda.amp.GradScaler off only because it runs CUDA's fp16 code in bfloat16,
whose range is float32's; lightning-habana's "16-mixed" ran float16 autocast with no scaler at all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator
from typing import Any

import torch
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from hpu_nb.core.fp8 import fp8_autocast
from hpu_nb.core.precision_names import autocast_dtype
from hpu_nb.runtime import get_backend

__all__ = ["autocast_context", "autocast_device_type", "hpu_autocast", "loss_scaler", "optimizer_unscales_itself"]


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
def autocast_context(precision: str, *, recipe: Any = None) -> Generator[None, None, None]:
    """The forward context for a unified precision: autocast on "hpu" (+ fp8 for "fp8"); cached casts are off on HPU."""
    dtype = autocast_dtype(precision)
    with contextlib.ExitStack() as stack:
        if dtype is not None:
            stack.enter_context(torch.autocast(autocast_device_type(), dtype=dtype, cache_enabled=False))
        if precision == "fp8":
            stack.enter_context(fp8_autocast(enabled=True, recipe=recipe))
        yield


def loss_scaler(precision: str, scaler: Any = None, *, sharded: bool = False) -> Any:
    """The loss scaler of a unified precision: the given one, else a GradScaler on "hpu" for "16-mixed" (FSDP's
    ShardedGradScaler with `sharded`), else None. A scaler with any other precision is refused, as Lightning does."""
    if scaler is not None:
        if precision != "16-mixed":
            raise ValueError(f"precision={precision!r} does not use a scaler, found {scaler}.")
        return scaler
    if precision != "16-mixed":
        return None
    if sharded:
        return ShardedGradScaler(device=autocast_device_type())
    return torch.amp.GradScaler(autocast_device_type())


def optimizer_unscales_itself(optimizer: Any) -> bool:
    """Whether the optimizer unscales the gradients in its own step (torch's fused optimizers): no clipping then."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))

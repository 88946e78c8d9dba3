"""habana_frameworks.torch.hpex.kernels.CTCLoss, emulated: Gaudi's connectionist-temporal-classification loss.

Modelled on the bridge's hpex/kernels/CTCLoss.py (release 1.19): an autograd Function
`CTCLoss.apply(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean", zero_infinity=False)`
with torch's `ctc_loss` semantics. The lengths must be tensors (Gaudi's op takes tensors and Habana saves them for
backward; lists are refused with a TypeError) and an unknown reduction is refused with torch's ValueError. The Gaudi
kernel keeps the per-sample losses and the alpha table for backward; so does the emulation, computing both with
torch's CPU kernels.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn._reduction import get_enum

__emulated__ = True

_NONE, _MEAN, _SUM = 0, 1, 2


def _per_sample_grad(grad: torch.Tensor, target_lengths: torch.Tensor, reduction: int, batch: int) -> torch.Tensor:
    """d(reduced loss) / d(each sample's loss)."""
    if reduction == _NONE:
        return grad
    if reduction == _SUM:
        return grad.expand(batch)
    return grad / target_lengths.clamp_min(1).to(grad.dtype) / batch


class CTCLoss(torch.autograd.Function):
    """CTC loss with Gaudi's signature; differentiable in log_probs."""

    @staticmethod
    def forward(ctx: Any, log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: torch.Tensor,
                target_lengths: torch.Tensor, blank: int = 0, reduction: str = "mean",
                zero_infinity: bool = False) -> torch.Tensor:
        reduction_enum = get_enum(reduction)
        for name, lengths in (("input_lengths", input_lengths), ("target_lengths", target_lengths)):
            if not isinstance(lengths, torch.Tensor):
                raise TypeError(f"CTCLoss: {name} must be a tensor (as Gaudi's kernel takes), got {type(lengths)}")
        with torch.autocast("hpu", enabled=False):
            losses, alpha = torch.ops.aten._ctc_loss(log_probs, targets, input_lengths, target_lengths, blank,
                                                     zero_infinity)
            # backward needs the raw losses (it zeroes the gradients of the infinite ones itself)
            kept = losses.masked_fill(torch.isinf(losses), 0.0) if zero_infinity else losses
            if reduction_enum == _MEAN:
                loss = (kept / target_lengths.clamp_min(1).to(kept.dtype)).mean()
            elif reduction_enum == _SUM:
                loss = kept.sum()
            else:
                loss = kept.clone()
        ctx.save_for_backward(log_probs, targets, input_lengths, target_lengths, losses, alpha)
        ctx.blank, ctx.reduction, ctx.zero_infinity = blank, reduction_enum, zero_infinity
        return loss

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        log_probs, targets, input_lengths, target_lengths, losses, alpha = ctx.saved_tensors
        batch = losses.shape[0]
        with torch.autocast("hpu", enabled=False):
            per_sample = _per_sample_grad(grad, target_lengths, ctx.reduction, batch).contiguous()
            grad_log_probs = torch.ops.aten._ctc_loss_backward(per_sample, log_probs, targets, input_lengths,
                                                               target_lengths, losses, alpha, ctx.blank,
                                                               ctx.zero_infinity)
        return grad_log_probs, None, None, None, None, None, None

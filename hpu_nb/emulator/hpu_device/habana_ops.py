"""Habana's custom operators (`torch.ops.hpu.*`) that libraries call on a Gaudi, for the emulated card.

Modelled on the schemas Habana's bridge registers (eager and lazy variants); the math is the documented op's,
written with torch ops so it runs (and is counted) on the emulated `hpu` device. DeepSpeed's HPU FusedAdam and
Habana's own FusedAdamW call `hpu::optimizer_adamw`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_library: torch.library.Library | None = None


def _adamw(grads: Sequence[torch.Tensor], weights: Sequence[torch.Tensor], exp_avgs: Sequence[torch.Tensor],
           exp_avg_sqs: Sequence[torch.Tensor], neg_step: torch.Tensor, beta1: float, beta2: float, epsilon: float,
           weight_decay: torch.Tensor | float | None) -> None:
    """One AdamW step in place: moments, decoupled weight decay (a multiplier), then
    weight += neg_step * m / (sqrt(v) + eps)."""
    if not weights:
        raise RuntimeError("optimizer_adamw : can not process empty weight vector")
    with torch.no_grad():
        for grad, weight, exp_avg, exp_avg_sq in zip(grads, weights, exp_avgs, exp_avg_sqs):
            exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
            if weight_decay is not None:
                weight.mul_(weight_decay)
            weight.add_(exp_avg / exp_avg_sq.sqrt().add_(epsilon) * neg_step)


def _optimizer_adamw(grads, weights, exp_avgs, exp_avg_sqs, neg_step_t, beta1, beta2, epsilon,
                     weight_decay, has_weight_decay, exp_avg_scales=None, exp_avg_sq_scales=None) -> None:
    _adamw(grads, weights, exp_avgs, exp_avg_sqs, neg_step_t, beta1, beta2, epsilon,
           weight_decay if has_weight_decay else None)


def _optimizer_adamw_lazy(grads, weights, exp_avgs, exp_avg_sqs, neg_step_t, beta1, beta2, epsilon,
                          weight_decay, exp_avg_scales=None, exp_avg_sq_scales=None) -> None:
    _adamw(grads, weights, exp_avgs, exp_avg_sqs, neg_step_t, beta1, beta2, epsilon,
           weight_decay if weight_decay != 1.0 else None)


def register() -> None:
    """Define `torch.ops.hpu.*` for the emulated card (once per process)."""
    global _library
    if _library is not None or hasattr(torch.ops.hpu, "optimizer_adamw"):
        return
    lib = torch.library.Library("hpu", "DEF")
    lib.define(
        "optimizer_adamw(Tensor[] gradient_vec, Tensor(a!)[] weight_vec, Tensor(b!)[] exp_avg_vec,"
        " Tensor(c!)[] exp_avg_sq_vec, Tensor neg_step_t, float beta1, float beta2, float epsilon,"
        " Tensor weight_decay, bool has_weight_decay, Tensor(d!)[]? exp_avg_scales=None,"
        " Tensor(e!)[]? exp_avg_sq_scales=None) -> ()"
    )
    lib.define(
        "optimizer_adamw.lazy(Tensor[] gradient_vec, Tensor(a!)[] weight_vec, Tensor(b!)[] exp_avg_vec,"
        " Tensor(c!)[] exp_avg_sq_vec, Tensor neg_step_t, float beta1, float beta2, float epsilon,"
        " float weight_decay, Tensor(d!)[]? exp_avg_scales=None, Tensor(e!)[]? exp_avg_sq_scales=None) -> ()"
    )
    lib.impl("optimizer_adamw", _optimizer_adamw, "CompositeExplicitAutograd")
    lib.impl("optimizer_adamw.lazy", _optimizer_adamw_lazy, "CompositeExplicitAutograd")
    _library = lib

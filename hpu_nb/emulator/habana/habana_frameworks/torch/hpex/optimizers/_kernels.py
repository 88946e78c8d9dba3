"""The fused optimizer ops of Habana's bridge (torch.ops.hpu.optimizer_*), emulated with torch's CPU ops.

Each function updates its tensors in place, with the maths of the bridge's graph builders (hpu_ops/backend/
optimizer_*_gen.cpp in gaudi-pytorch-bridge 1.19), so an optimizer built on them takes, on the emulated Gaudi, the
steps it takes on a Gaudi - including where that differs from torch.optim (e.g. where AdamW adds eps).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from hpu_nb.runtime.generations import GENERATIONS

__emulated__ = True

# The fp8 ranges the bridge's AdamW uses when it keeps its moments in fp8: Gaudi2's (its e4m3 tops out at 240).
GAUDI_FP8_MAX = {torch.float8_e4m3fn: GENERATIONS["gaudi2"].fp8_max("E4M3"),
                 torch.float8_e5m2: GENERATIONS["gaudi2"].fp8_max("E5M2")}
FP8_DTYPES = tuple(GAUDI_FP8_MAX)


def _check_same_length(what: str, *lists: Sequence) -> None:
    if len({len(x) for x in lists}) > 1:
        raise RuntimeError(f"{what}: all vector inputs must have the same number of elements but they respectively"
                           f" have: {', '.join(str(len(x)) for x in lists)}")


def _to_fp8(x: torch.Tensor, old_scale: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The bridge's moment-to-fp8 cast: scale = 2**floor(log2(fp8_max / amax)), kept when not usable; x * scale."""
    amax = x.detach().abs().amax().float()
    new_scale = torch.exp2(torch.floor(torch.log2(GAUDI_FP8_MAX[dtype] / amax)))
    # The bridge keeps the old scale where the new one is not > 0; an all-zero moment (amax 0) would give inf: kept too.
    usable = (new_scale > 0) & torch.isfinite(new_scale)
    scale = torch.where(usable, new_scale.to(old_scale.dtype), old_scale.reshape(()))
    return (x.float() * scale.float()).to(dtype), scale.reshape(old_scale.shape)


def _on(t: torch.Tensor, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A one-element operand (lr, step, decay) where the tensor it multiplies lives, as the bridge moves it there."""
    return t.to(device=like.device, dtype=dtype or like.dtype)


def _from_fp8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() / scale.float()).to(dtype)


def adamw(grads: Sequence[torch.Tensor], weights: Sequence[torch.Tensor], exp_avgs: Sequence[torch.Tensor],
          exp_avg_sqs: Sequence[torch.Tensor], neg_step: torch.Tensor, beta1: float, beta2: float, eps: float,
          modified_wd: torch.Tensor, has_weight_decay: bool,
          exp_avg_scales: Sequence[torch.Tensor] | None = None,
          exp_avg_sq_scales: Sequence[torch.Tensor] | None = None) -> None:
    """hpu::optimizer_adamw: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; w = w * modified_wd + neg_step m/(sqrt(v)+eps).

    neg_step carries the bias corrections (-lr sqrt(1-b2^t) / (1-b1^t)), so eps is added to the uncorrected sqrt(v):
    torch.optim.AdamW adds it to the corrected one. Moments compute in promote(grad, moment) dtype, or from fp8 with a
    power-of-two scale per tensor (updated every step).
    """
    _check_same_length("optimizer_adamw", grads, weights, exp_avgs, exp_avg_sqs)
    if not exp_avgs:
        return
    fp8 = exp_avgs[0].dtype in FP8_DTYPES
    if fp8 and (exp_avg_scales is None or exp_avg_sq_scales is None):
        raise RuntimeError("optimizer_adamw: fp8 moments need exp_avg_scales and exp_avg_sq_scales.")
    for i, (grad, weight, exp_avg, exp_avg_sq) in enumerate(zip(grads, weights, exp_avgs, exp_avg_sqs)):
        dtype = grad.dtype if fp8 else torch.promote_types(grad.dtype, exp_avg.dtype)
        if fp8:
            m = _from_fp8(exp_avg, exp_avg_scales[i], dtype)
            v = _from_fp8(exp_avg_sq, exp_avg_sq_scales[i], dtype)
        else:
            m, v = exp_avg.to(dtype), exp_avg_sq.to(dtype)
        g = grad.to(dtype)
        m = m * beta1 + g * (1.0 - beta1)
        v = v * beta2 + g * g * (1.0 - beta2)
        update = m / (v.sqrt() + eps) * _on(neg_step, m)
        w = weight.to(dtype) * _on(modified_wd, m) if has_weight_decay else weight.to(dtype)
        weight.copy_(w + update)
        if fp8:
            q, scale = _to_fp8(m, exp_avg_scales[i], exp_avg.dtype)
            exp_avg.copy_(q)
            exp_avg_scales[i].copy_(scale)
            q, scale = _to_fp8(v, exp_avg_sq_scales[i], exp_avg_sq.dtype)
            exp_avg_sq.copy_(q)
            exp_avg_sq_scales[i].copy_(scale)
        else:
            exp_avg.copy_(m)
            exp_avg_sq.copy_(v)


def sgd(grads: Sequence[torch.Tensor], weights: Sequence[torch.Tensor], lr: torch.Tensor, weight_decay: float,
        momentum_buffers: Sequence[torch.Tensor] | None = None, momentum: float = 0.0, dampening: float = 0.0,
        nesterov: bool = False) -> None:
    """hpu::optimizer_sgd(_momentum): torch.optim.SGD's update (the bridge's tests check it against it), with the
    momentum buffer the bridge keeps: allocated as zeros, so the first step's buffer is (1 - dampening) g."""
    _check_same_length("optimizer_sgd", grads, weights, *([momentum_buffers] if momentum_buffers is not None else []))
    for i, (grad, weight) in enumerate(zip(grads, weights)):
        d_p = grad + weight * weight_decay if weight_decay != 0 else grad
        if momentum_buffers is not None:
            buf = momentum_buffers[i]
            buf.mul_(momentum).add_(d_p, alpha=1.0 - dampening)
            d_p = d_p + buf * momentum if nesterov else buf
        weight.sub_(d_p * _on(lr, weight))


def lamb_fused_norm(grads: Sequence[torch.Tensor], max_grad_norm: float) -> torch.Tensor:
    """hpu::optimizer_lamb_fused_norm: the divisor of the global gradient clipping, norm / max_norm when the global
    norm exceeds max_norm, else 1 (a one-element tensor)."""
    if not grads:
        raise RuntimeError("Gradiens list in OptimizerLambNorm cannot be empty")  # the bridge's message, as it is
    dtype = grads[0].dtype
    norm = torch.stack([g.to(dtype).pow(2).sum() for g in grads]).sum().sqrt().reshape(1)
    return torch.where(norm <= max_grad_norm, torch.ones_like(norm), norm / max_grad_norm)


def lamb_phase1(grads: Sequence[torch.Tensor], weights: Sequence[torch.Tensor], exp_avgs: Sequence[torch.Tensor],
                exp_avg_sqs: Sequence[torch.Tensor], clip_divisor: torch.Tensor, grad_averaging: bool, beta1: float,
                beta2: float, eps: float, bias_correction1: torch.Tensor, bias_correction2: torch.Tensor,
                weight_decay: float) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """hpu::optimizer_lamb_phase1: moments from the clipped gradient; returns (weight norms, update norms, updates),
    update = (m / bc1) / (sqrt(v / bc2) + eps) + weight_decay * w."""
    beta3 = 1.0 - beta1 if grad_averaging else 1.0
    weight_norms, update_norms, updates = [], [], []
    for grad, weight, exp_avg, exp_avg_sq in zip(grads, weights, exp_avgs, exp_avg_sqs):
        g = grad / _on(clip_divisor, grad)
        exp_avg.mul_(beta1).add_(g * beta3)
        exp_avg_sq.mul_(beta2).add_(g * g * (1.0 - beta2))
        update = (exp_avg / bias_correction1) / ((exp_avg_sq / bias_correction2).sqrt() + eps)
        if weight_decay != 0.0:
            update = update + weight * weight_decay
        weight_norms.append(torch.linalg.vector_norm(weight).reshape(1))
        update_norms.append(torch.linalg.vector_norm(update).reshape(1))
        updates.append(update)
    return weight_norms, update_norms, updates


def lamb_phase2(weights: Sequence[torch.Tensor], update_norms: Sequence[torch.Tensor],
                weight_norms: Sequence[torch.Tensor], updates: Sequence[torch.Tensor], neg_lr: torch.Tensor,
                weight_decay: float, use_lamb: bool) -> None:
    """hpu::optimizer_lamb_phase2: w += -lr * trust * update, trust = |w| / |update| (1 when either norm is 0, as
    Habana's reference), applied only with weight decay or use_lamb, as the bridge does."""
    for weight, update_norm, weight_norm, update in zip(weights, update_norms, weight_norms, updates):
        step = update * _on(neg_lr, update)
        if weight_decay != 0.0 or use_lamb:
            # Habana's reference LAMB (the bridge's tests, TorchNVLAMB): the trust ratio is 1 unless both norms are
            # positive. (The bridge's phase-2 graph masks |update| > 0 only, which leaves a zero-initialised
            # parameter at 0 for ever; the reference, which its tests hold the kernel to, moves it.)
            usable = (update_norm > 0) & (weight_norm > 0)
            trust = torch.where(usable, weight_norm / update_norm, torch.ones_like(update_norm))
            step = step * trust
        weight.add_(step)


def lars(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], skip_masks: Sequence[int], eeta: float,
         weight_decay: float, eps: float, lr: torch.Tensor) -> None:
    """hpu::optimizer_lars: the gradient becomes the step, in place: lr * g where the skip mask is 0; elsewhere
    lr * trust * (g + weight_decay * w), trust = eeta |w| / (|w| weight_decay + eps + |g|) (1 if either norm is 0)."""
    _check_same_length("optimizer_lars", params, grads, skip_masks)
    for param, grad, skip in zip(params, grads, skip_masks):
        if not skip:
            grad.mul_(_on(lr, grad))
            continue
        p_norm = torch.linalg.vector_norm(param)
        g_norm = torch.linalg.vector_norm(grad)
        ratio = eeta * p_norm / (p_norm * weight_decay + eps + g_norm)
        one = torch.ones_like(ratio)
        trust = torch.where(p_norm > 0, torch.where(g_norm > 0, ratio, one), one)
        grad.copy_((grad + param * weight_decay) * (trust * _on(lr, trust)))


def resource_apply_momentum(params_and_buffers: list, d_ps: Sequence[torch.Tensor], momentum: float) -> None:
    """hpu::optimizer_resource_apply_momentum on the interleaved [p0, buf0, p1, buf1, ...]: buf = momentum buf - d_p;
    p += buf (TensorFlow's ResourceApplyMomentum: d_p is already lr-scaled, e.g. by FusedLars)."""
    if len(params_and_buffers) != 2 * len(d_ps):
        raise RuntimeError("params_momentum_buf_list must have twice as many elements as dp_list but they respectively"
                           f" have: {len(params_and_buffers)}, {len(d_ps)}")
    for i, d_p in enumerate(d_ps):
        param, buf = params_and_buffers[2 * i], params_and_buffers[2 * i + 1]
        buf.mul_(momentum).sub_(d_p)
        param.add_(buf)


def adagrad(grads: Sequence[torch.Tensor], weights: Sequence[torch.Tensor], sums: Sequence[torch.Tensor], step: int,
            lr: float, weight_decay: float, lr_decay: float, eps: float) -> None:
    """fused_adagrad: torch.optim.Adagrad's update (sum += g^2; w -= lr / (1 + (t-1) lr_decay) g / (sqrt(sum)+eps))."""
    _check_same_length("fused_adagrad", grads, weights, sums)
    clr = lr / (1.0 + (step - 1) * lr_decay)
    for grad, weight, acc in zip(grads, weights, sums):
        g = grad + weight * weight_decay if weight_decay != 0 else grad
        acc.addcmul_(g, g, value=1.0)
        weight.addcdiv_(g, acc.sqrt().add_(eps), value=-clr)


def ema(model_values: Sequence[torch.Tensor], ema_values: Sequence[torch.Tensor], decay: torch.Tensor) -> None:
    """hpu::optimizer_ema: ema = ema * decay + (1 - decay) * value, for every entry of a state dict (integer entries,
    such as BatchNorm's num_batches_tracked, too: truncated back to their dtype)."""
    if len(model_values) != len(ema_values):
        raise RuntimeError("model_inputs and updated_ema vector inputs must have the same number of elements but they"
                           f" respectively have: {len(model_values)}, {len(ema_values)}")
    for value, average in zip(model_values, ema_values):
        d = _on(decay.reshape(()), average, average.dtype if average.is_floating_point() else torch.float32)
        new = average * d + (1 - d) * value
        average.copy_(new.to(average.dtype))


def bias_corrected_step(lr: float, beta1: float, beta2: float, step: int) -> float:
    """The step size the bridge's FusedAdamW hands its kernel: lr sqrt(1 - beta2^t) / (1 - beta1^t)."""
    return lr * math.sqrt(1.0 - beta2**step) / (1.0 - beta1**step)


# The dtypes FusedAdamW keeps its moments in on a Gaudi (the bridge's tests: None, bf16, fp32, fp8 pairs; fp16 too).
MOMENT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, *FP8_DTYPES)


def check_moments_dtype(moments_dtype: Any) -> None:
    """ValueError unless `moments_dtype` is None, one of MOMENT_DTYPES or an (exp_avg, exp_avg_sq) pair of them: an
    integer dtype truncated the moments to zero, a string failed only at the first step()."""
    if moments_dtype is None:
        return
    pair = isinstance(moments_dtype, tuple)
    dtypes = moments_dtype if pair else (moments_dtype,)
    if (pair and len(dtypes) != 2) or not all(isinstance(d, torch.dtype) and d in MOMENT_DTYPES for d in dtypes):
        names = ", ".join(str(d) for d in MOMENT_DTYPES)
        raise ValueError(f"Invalid moments_dtype: {moments_dtype!r} - should be None (the parameters' dtype), one of "
                         f"{names}, or an (exp_avg, exp_avg_sq) pair of them")
    if pair and len({d in FP8_DTYPES for d in dtypes}) > 1:  # the kernel takes the first moment's kind for both
        raise ValueError(f"Invalid moments_dtype: {moments_dtype!r} - both moments in fp8 or neither: the fused AdamW "
                         "kernel reads both the way it reads the first one")


def restore_moment(saved: torch.Tensor, saved_scale: torch.Tensor | None, dtype: torch.dtype,
                   param: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A moment from a state dict as the optimizer keeps it: (tensor in `dtype` on the parameter's device, its fp8
    scale in the parameter's dtype or None). The saved tensor as it was when it already has that dtype (and scale);
    otherwise converted through its true value (an fp8 one divided by its scale), fp8 re-scaled as a step would."""
    if saved.dtype == dtype and (dtype not in FP8_DTYPES or saved_scale is not None):
        scale = None if saved_scale is None else saved_scale.to(device=param.device, dtype=param.dtype)
        return saved.to(device=param.device), scale
    value = _from_fp8(saved, saved_scale, torch.float32) if saved_scale is not None else saved.float()
    if dtype in FP8_DTYPES:
        q, scale = _to_fp8(value, torch.ones(1, dtype=param.dtype), dtype)
        return q.to(param.device), scale.to(param.device)
    return value.to(device=param.device, dtype=dtype), None


def moment_dtypes(moments_dtype: Any, param_dtype: torch.dtype) -> tuple[torch.dtype, torch.dtype]:
    """(exp_avg, exp_avg_sq) dtypes for FusedAdamW's `moments_dtype`: one dtype for both, a pair, or None (the
    parameter's), as the bridge reads it."""
    if moments_dtype is None:
        return param_dtype, param_dtype
    if isinstance(moments_dtype, tuple):
        return moments_dtype
    return moments_dtype, moments_dtype


def moments_in_fp8(moments_dtype: Any) -> bool:
    """Whether either moment is kept in an fp8 dtype (then each gets a scale)."""
    dtypes = moments_dtype if isinstance(moments_dtype, tuple) else (moments_dtype,)
    return any(d in FP8_DTYPES for d in dtypes)

"""habana_frameworks.torch.hpex.normalization.FusedRMSNorm, emulated: Gaudi's fused RMS normalisation.

Modelled on the bridge's hpex/normalization/FusedRMSNorm.py and its rms_norm op (release 1.19):
`FusedRMSNorm.apply(data_in, gamma, eps, use_stages=True, bwd_mode=0, fast_math=False)` returns
data_in * gamma / sqrt(mean(data_in ** 2, last dim) + eps), in data_in's dtype when gamma has the same dtype and in
float32 when they differ (as the Gaudi op's output rule). Backward gives the gradients of data_in and gamma.
`use_stages`, `bwd_mode` and `fast_math` pick Gaudi kernels (staged backward, width partitioning, a faster
approximation); on the emulated Gaudi they are accepted and change nothing: everything is computed in float32.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

import torch

__emulated__ = True


class RmsNormBwdMode(Enum):
    DEFAULT = 0
    STATIC_CASE_WIDTH_PARTITIONING = 1


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class FusedRMSNorm(torch.autograd.Function):
    """RMSNorm over the last dimension with a learned scale (see the module docstring)."""

    @staticmethod
    def forward(ctx: Any, data_in: torch.Tensor, gamma: torch.Tensor, eps: float, use_stages: bool = True,
                bwd_mode: int = 0, fast_math: bool = False) -> torch.Tensor:
        if not (data_in.is_floating_point() and gamma.is_floating_point()):
            raise RuntimeError(f"FusedRMSNorm: data_in and gamma must be floating point tensors, got {data_in.dtype} "
                               f"and {gamma.dtype} (integers would be truncated: convert them first).")
        out_dtype = data_in.dtype if data_in.dtype == gamma.dtype else torch.float32
        dtype = _compute_dtype(out_dtype)
        with torch.autocast("hpu", enabled=False):
            x = data_in.to(dtype)
            inverse_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
            out = (x * inverse_rms * gamma.to(dtype)).to(out_dtype)
        ctx.save_for_backward(inverse_rms, data_in, gamma)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        inverse_rms, data_in, gamma = ctx.saved_tensors
        dtype = inverse_rms.dtype
        with torch.autocast("hpu", enabled=False):
            x, g, dy = data_in.to(dtype), gamma.to(dtype), grad_out.to(dtype)
            normalised = x * inverse_rms
            dy_gamma = dy * g
            grad_x = inverse_rms * (dy_gamma - normalised * (dy_gamma * normalised).mean(dim=-1, keepdim=True))
            grad_gamma = (dy * normalised).sum_to_size(gamma.shape)
        return grad_x.to(data_in.dtype), grad_gamma.to(gamma.dtype), None, None, None, None

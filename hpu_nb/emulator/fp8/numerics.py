"""fp8 numerics on the CPU: scaled casts to float8 and the fp8 matmul (torch._scaled_mm).

`torch._scaled_mm` runs on the CPU in torch 2.13 for e4m3 x e4m3, e5m2 x e4m3 and e5m2 x e5m2 with float32 or
bfloat16 output. If a torch build lacks it, `scaled_mm` falls back to the closest honest equivalent: the same
fp8-rounded operands dequantised to float32 and multiplied (MATMUL_PATH says which one runs).
"""

from __future__ import annotations

import functools
import math

import torch

FP8_MAX = {
    torch.float8_e4m3fn: torch.finfo(torch.float8_e4m3fn).max,
    torch.float8_e5m2: torch.finfo(torch.float8_e5m2).max,
}


def fp8_max(dtype: torch.dtype) -> float:
    try:
        return float(FP8_MAX[dtype])
    except KeyError:
        raise ValueError(f"{dtype} is not an fp8 dtype; use torch.float8_e4m3fn or torch.float8_e5m2.") from None


def amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| as a float32 scalar tensor (0 for an empty tensor, e.g. a batch of no rows)."""
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=x.device)
    return x.detach().abs().amax().float()


def scale_from_amax(
    amax_value: torch.Tensor, dtype: torch.dtype, margin: int = 0, power_of_two: bool = False
) -> torch.Tensor:
    """fp8_max / amax / 2**margin (1 where amax is 0 or not finite); optionally rounded down to a power of two."""
    amax_value = amax_value.float()
    ok = torch.isfinite(amax_value) & (amax_value > 0)
    scale = torch.where(ok, fp8_max(dtype) / amax_value.clamp(min=torch.finfo(torch.float32).tiny),
                        torch.ones_like(amax_value))
    scale = scale / (2.0**margin)
    if power_of_two:
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    return scale


def quantize(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x * scale, saturated to the fp8 range (float8_e4m3fn has no inf: out of range would be NaN) and cast."""
    limit = fp8_max(dtype)
    return (x.float() * scale).clamp(-limit, limit).to(dtype)


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (q.float() / scale).to(dtype)


@functools.lru_cache(maxsize=1)
def _scaled_mm_works() -> bool:
    try:
        a = torch.ones(16, 16).to(torch.float8_e4m3fn)
        b = torch.ones(16, 16).to(torch.float8_e5m2)
        one = torch.tensor(1.0)
        out = torch._scaled_mm(b, a.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
        return bool(torch.allclose(out, torch.full((16, 16), 16.0)))
    except (RuntimeError, AttributeError, NotImplementedError, TypeError):
        return False


def matmul_path() -> str:
    return "torch._scaled_mm" if _scaled_mm_works() else "dequantize + float32 matmul (torch._scaled_mm unavailable)"


def scaled_mm(
    a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """(a / a_scale) @ (b / b_scale) for fp8 `a` (m, k) and `b` (k, n), accumulated in float32."""
    if 0 in (a.shape[0], a.shape[1], b.shape[1]):  # no rows, columns or terms: _scaled_mm refuses empty operands
        return torch.zeros(a.shape[0], b.shape[1], dtype=out_dtype, device=a.device)
    inv_a = (1.0 / a_scale).float().reshape(())
    inv_b = (1.0 / b_scale).float().reshape(())
    if _scaled_mm_works():
        # _scaled_mm wants a row-major and b column-major
        a = a if a.is_contiguous() else a.contiguous()
        b = b if b.t().is_contiguous() else b.t().contiguous().t()
        return torch._scaled_mm(a, b, scale_a=inv_a, scale_b=inv_b, out_dtype=out_dtype)
    return ((a.float() * inv_a) @ (b.float() * inv_b)).to(out_dtype)


def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    """||approx - exact|| / ||exact|| in float64."""
    exact = exact.double()
    denom = exact.norm().item()
    return (approx.double() - exact).norm().item() / (denom if denom > 0 else math.inf)

"""fp8 numerics on the CPU: scaled casts to float8 and the fp8 matmul, in two equivalent forms.

- Stored fp8: `quantize` casts to torch.float8_e4m3fn / float8_e5m2 and `scaled_mm` multiplies with torch._scaled_mm
  (it runs on the CPU in torch 2.13 for e4m3 x e4m3, e5m2 x e4m3 and e5m2 x e5m2; if a torch build lacks it,
  `scaled_mm` multiplies the same operands dequantised to float32: `matmul_path()` says which one runs). Used where
  fp8 is stored (inference weights) and as the reference.
- fp8 values held in float32 (the training layers' fast path): every E4M3 / E5M2 value is exactly a float32, so
  `round_to_fp8_grid` rounds a float32 tensor to the fp8 grid (round to nearest even, subnormals, saturation: bitwise
  the values `quantize(...).float()` gives, checked in tests) with a few vectorised float ops, where torch's fp8 casts
  are scalar loops on the CPU; `fp8_grid_mm` multiplies such operands with a bf16-input matmul (fp8 values are exact
  bf16 ones; exact products, float32 accumulation and result) and applies the inverse scales afterwards, as
  torch._scaled_mm does. Same quantisation, same scales, float32 accumulation: the results agree with
  torch._scaled_mm to float32 summation-order error (bitwise where float32 sums are exact).
- One pass: where the emulated device's library is loaded, `quantize_with_amax` rounds to the grid and takes the
  tensor's amax in one vectorised C++ pass (`torch.ops.hpu_emu.fp8_round_amax`: the same float32 operations as
  `round_to_fp8_grid`, so bitwise its results); elsewhere (no library, an older build of it) it runs the torch passes.
"""

from __future__ import annotations

import contextlib
import functools
import math
import struct
from collections.abc import Callable, Iterator

import torch

from hpu_nb.runtime.generations import Generation

FP8_FORMATS = {torch.float8_e4m3fn: "E4M3", torch.float8_e5m2: "E5M2"}  # torch's dtype for each Gaudi fp8 format


def emulated_generation() -> Generation:
    """The emulated card's generation (HPU_NB_DEVICE's until the card starts): the fp8 full scales and hardware-aligned
    scales are its own (runtime.generations owns them), as a Gaudi's are its generation's."""
    from hpu_nb.emulator import hpu_device  # noqa: PLC0415 -- the card in force, read when asked (it may change)

    return (hpu_device.card_config() if hpu_device.is_loaded() else hpu_device.config_from_environment()).generation


def fp8_format(dtype: torch.dtype) -> str:
    try:
        return FP8_FORMATS[dtype]
    except KeyError:
        raise ValueError(f"{dtype} is not an fp8 dtype; use torch.float8_e4m3fn or torch.float8_e5m2.") from None


def fp8_max(dtype: torch.dtype, generation: Generation | None = None) -> float:
    """The full scale of `dtype` on `generation` (default: the emulated card's): the largest value its fp8 holds and
    scales aim at. e4m3 ends at 240 on Gaudi2 (INC's get_fullscale takes float8_e4m3fnuz's range there; the bridge's
    quantizer and fp8 AdamW use 240) and at 448 on Gaudi3; e5m2 at 57344 on both. Values are stored as torch's
    float8_e4m3fn, which holds every Gaudi2 e4m3 value in range."""
    fmt = fp8_format(dtype)
    return (generation or emulated_generation()).fp8_max(fmt)


def amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| as a float32 scalar tensor (0 for an empty tensor, e.g. a batch of no rows)."""
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=x.device)
    return x.detach().abs().amax().float()


def scale_from_amax(
    amax_value: torch.Tensor, dtype: torch.dtype, margin: int = 0
) -> torch.Tensor:
    """The transformer engine's scale (a multiplier: x * scale is cast): fp8_max / amax / 2**margin, fp8_max the
    emulated card's full scale (1 where amax is 0 or not finite)."""
    amax_value = amax_value.float()
    ok = torch.isfinite(amax_value) & (amax_value > 0)
    scale = torch.where(ok, fp8_max(dtype) / amax_value.clamp(min=torch.finfo(torch.float32).tiny),
                        torch.ones_like(amax_value))
    return scale / (2.0**margin)


# Intel Neural Compressor's maxabs scale methods (fp8_quant/_core/scale_methods/scale_method_config.py): a tensor's
# scale is a divisor (x / scale is cast), amax / (full scale * backoff), the backoff leaving weights half the range and
# activations a quarter; maxabs_pow2 rounds it up to a power of two, maxabs_hw further to the card's hardware-aligned
# scales (round_scales_function.py ScaleToHwAligned), maxabs_arbitrary keeps it.
INC_BACKOFF = {"weight": 0.5, "input": 0.25}
INC_SCALE_ROUNDING = {"maxabs_arbitrary": "none", "maxabs_pow2": "pow2", "maxabs_hw": "hw_aligned"}


def inc_scale(
    amax_value: torch.Tensor, dtype: torch.dtype, method: str, backoff: float, generation: Generation | None = None
) -> torch.Tensor:
    """INC's per-tensor fp8 scale (a divisor) for `method` ("maxabs_arbitrary" / "maxabs_pow2" / "maxabs_hw" or
    "unit_scale") on `generation` (default: the emulated card's). hw_aligned: the power of two rounded up to a step of
    the card's aligned scales (Gaudi2's 16, 1, 1/16, 1/256 are 16**k; Gaudi3's every power of two) and clamped to
    their range. An amax of 0 or not finite gives 1 (INC would divide by 0; any scale casts zeros alike)."""
    if method == "unit_scale":
        return torch.ones_like(amax_value.float())
    if method not in INC_SCALE_ROUNDING:
        raise ValueError(f"scale method {method!r}: the emulated Gaudi computes {['unit_scale', *INC_SCALE_ROUNDING]}.")
    generation = generation or emulated_generation()
    amax_value = amax_value.float()
    ok = torch.isfinite(amax_value) & (amax_value > 0)
    scale = torch.where(ok, amax_value / (generation.fp8_max(fp8_format(dtype)) * backoff), torch.ones_like(amax_value))
    rounding = INC_SCALE_ROUNDING[method]
    if rounding == "none":
        return scale
    scale = torch.exp2(torch.ceil(torch.log2(scale)))
    if rounding == "hw_aligned":
        aligned = generation.fp8_hw_scales(fp8_format(dtype))
        exponents = sorted(round(math.log2(s)) for s in aligned)
        step = exponents[1] - exponents[0] if len(exponents) > 1 else 1
        scale = torch.exp2(torch.ceil(torch.log2(scale) / step) * step).clamp(min(aligned), max(aligned))
    return scale


def quantize(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x * scale, saturated to the fp8 range (float8_e4m3fn has no inf: out of range would be NaN) and cast."""
    limit = fp8_max(dtype)
    return (x.float() * scale).clamp(-limit, limit).to(dtype)


# Mantissa bits and the exponent of the smallest normal number of each fp8 format (E4M3: 2**-6, E5M2: 2**-14).
MANTISSA_BITS = {torch.float8_e4m3fn: 3, torch.float8_e5m2: 2}
MIN_NORMAL_EXPONENT = {torch.float8_e4m3fn: -6, torch.float8_e5m2: -14}
_FLOAT32_EXPONENT_BITS = 0x7F800000


def round_to_fp8_grid(
    scaled: torch.Tensor, dtype: torch.dtype, saturate: bool = True, scratch: torch.Tensor | None = None
) -> torch.Tensor:
    """Round a float32 tensor (already multiplied by its scale) to the nearest `dtype` value, in place and returned.

    Saturates to the format's range first, as `quantize` does (`saturate=False` when the caller knows no value is
    out of range: then clamping changes nothing). Rounding: with 2**e the power of two at or below |x| (raised to the
    smallest normal, where the grid of subnormals is evenly spaced), the fp8 grid step is 2**(e - mantissa bits);
    adding and then subtracting M = 1.5 * 2**(e + 23 - mantissa bits) makes the float32 adder round x to that step,
    to nearest even (x + M stays in M's binade, where float32's own step is exactly the fp8 step), and the
    subtraction is exact. M is formed as 2**e times a power-of-two multiple of 1.5, a product that is exact.
    """
    if scaled.dtype != torch.float32:
        raise TypeError(f"round_to_fp8_grid rounds float32 tensors, got {scaled.dtype}.")
    if saturate:
        limit = fp8_max(dtype)
        scaled.clamp_(-limit, limit)
    if scratch is not None and scratch.shape == scaled.shape and scratch.dtype == torch.float32:
        torch.bitwise_and(scaled.view(torch.int32), _FLOAT32_EXPONENT_BITS, out=scratch.view(torch.int32))
        power = scratch
    else:
        power = (scaled.view(torch.int32) & _FLOAT32_EXPONENT_BITS).view(torch.float32)  # 2**e, sign dropped
    power.clamp_(min=2.0 ** MIN_NORMAL_EXPONENT[dtype])
    factor = 1.5 * 2.0 ** (23 - MANTISSA_BITS[dtype])
    return scaled.add_(power, alpha=factor).sub_(power, alpha=factor)


def quantize_to_grid(
    x: torch.Tensor, scale: float | torch.Tensor, dtype: torch.dtype,
    x_amax: float | torch.Tensor | None = None, scratch: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """`quantize(x, scale, dtype).float()`, computed without fp8 casts: x * scale on the fp8 grid, as float32.

    With `x_amax` (max |x|, already known) the saturating clamp is skipped when amax * scale is in range: rounding is
    monotonic, so no element of x * scale exceeds it and the clamp would change nothing. `scratch`: a float32 tensor
    of x's shape to reuse for the rounding's work; `out`: one to hold the result (each saves allocating, and so
    faulting in, the pages of a large tensor)."""
    scale = float(scale)  # a float32 value, exactly; x * scale still multiplies in float32
    if out is not None and out.shape == x.shape and out.dtype == torch.float32:
        # x.float() * scale: the conversion to float32 is exact, the product rounds once, in float32
        scaled = torch.mul(x, scale, out=out) if x.dtype == torch.float32 else out.copy_(x).mul_(scale)
    else:
        scaled = x.float() * scale
    saturate = x_amax is None or not float(x_amax) * scale <= fp8_max(dtype)  # exact product: a safe test
    return round_to_fp8_grid(scaled, dtype, saturate=saturate, scratch=scratch)


FUSED_INPUT_DTYPES = (torch.float32, torch.bfloat16)
FUSED_DEVICE_TYPES = ("cpu", "hpu")  # an emulated hpu tensor's data is host memory
FUSED_KERNEL = ("hpu_emu", "fp8_round_amax")  # torch.ops namespace and name, in hpu_device.cpp
_fused_kernel: Callable[..., float] | None = None


def fused_rounding_kernel() -> Callable[..., float] | None:
    """`torch.ops.hpu_emu.fp8_round_amax` where the emulated device's library is loaded and has it, else None (never
    loads the library: asked again on the next call, as it may be loaded later)."""
    global _fused_kernel
    if _fused_kernel is None:
        try:
            namespace, name = FUSED_KERNEL
            _fused_kernel = getattr(getattr(torch.ops, namespace), name)
        except (AttributeError, RuntimeError):
            return None
    return _fused_kernel


@torch.library.custom_op("hpu_nb::fp8_round_amax", mutates_args=("out",))
def traceable_round_amax(x: torch.Tensor, scale: float, mantissa_bits: int, min_normal_exponent: int, fp8_max: float,
                         out: torch.Tensor) -> torch.Tensor:
    """`torch.ops.hpu_emu.fp8_round_amax` as torch.compile can trace it: the C++ op is registered as a catch-all
    (CompositeImplicitAutograd) kernel, to which torch lets no fake / meta kernel be added, so under FakeTensorMode it
    would run its C++ body on data-less tensors ("RuntimeError when making fake tensor call"). This op calls it and
    returns the amax as a 0-dim float32 tensor; its fake kernel (below) says only that shape. Eager calls skip it."""
    kernel = fused_rounding_kernel()
    if kernel is None:
        raise RuntimeError("hpu_nb::fp8_round_amax needs the emulated device's library (torch.ops.hpu_emu).")
    return torch.tensor(kernel(x, scale, mantissa_bits, min_normal_exponent, fp8_max, out), dtype=torch.float32)


@traceable_round_amax.register_fake
def _fake_round_amax(x: torch.Tensor, scale: float, mantissa_bits: int, min_normal_exponent: int, fp8_max: float,
                     out: torch.Tensor) -> torch.Tensor:
    """`out` is written in place (x's shape, float32: checked by the kernel); the amax is a float32 scalar tensor."""
    return torch.empty((), dtype=torch.float32)


class _FusedRounding:
    enabled = True  # False inside torch_rounding_passes()


@contextlib.contextmanager
def torch_rounding_passes() -> Iterator[None]:
    """Inside the block, quantize_with_amax runs the pure-torch passes even where the fused kernel exists (the
    reference the kernel is tested and benchmarked against)."""
    previous = _FusedRounding.enabled
    _FusedRounding.enabled = False
    try:
        yield
    finally:
        _FusedRounding.enabled = previous


def fused_rounding_applies(x: torch.Tensor) -> bool:
    """Whether `quantize_with_amax(x, ...)` runs the one-pass kernel (no work tensor needed then)."""
    return (_FusedRounding.enabled and x.dtype in FUSED_INPUT_DTYPES and x.device.type in FUSED_DEVICE_TYPES
            and fused_rounding_kernel() is not None)


def quantize_with_amax(
    x: torch.Tensor, scale: float | torch.Tensor, dtype: torch.dtype, need_amax: bool = True,
    scratch: torch.Tensor | None = None, out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, float | None]:
    """(quantize_to_grid(x, scale, dtype), amax_value(x)): what delayed scaling needs of a tensor (quantised with
    the history's scale, its own amax recorded), in one pass over x where the fused kernel runs. Without it, two
    torch passes, and the amax (None) only when `need_amax`. `scratch` / `out` as in quantize_to_grid."""
    if fused_rounding_applies(x):
        if (out is None or out.shape != x.shape or out.dtype != torch.float32 or out.device != x.device
                or not out.is_contiguous()):
            out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
        args = (x.detach(), to_float32(float(scale)), MANTISSA_BITS[dtype], MIN_NORMAL_EXPONENT[dtype], fp8_max(dtype))
        if torch.compiler.is_compiling():  # traced: the op with a fake kernel (the amax is read after the graph)
            return out, float(traceable_round_amax(*args, out))
        kernel = fused_rounding_kernel()
        assert kernel is not None
        return out, kernel(*args, out)
    x_amax = amax_value(x) if need_amax else None
    return quantize_to_grid(x, scale, dtype, x_amax, scratch=scratch, out=out), x_amax


def to_float32(value: float) -> float:
    """`value` rounded to the nearest float32 (as a Python float)."""
    return struct.unpack("f", struct.pack("f", value))[0]


def inverse_scale(a_scale: float | torch.Tensor, b_scale: float | torch.Tensor) -> float:
    """(1 / a_scale) * (1 / b_scale) in float32 arithmetic, as `scaled_mm` forms the factor torch._scaled_mm applies.
    Each operation is done in double and rounded to float32: for float32 operands that double rounding is exact
    (53 >= 2 * 24 + 2), so this is the float32 result."""
    inv_a, inv_b = to_float32(1.0 / float(a_scale)), to_float32(1.0 / float(b_scale))
    return to_float32(inv_a * inv_b)


def fp8_grid_mm(
    a: torch.Tensor, b: torch.Tensor, inverse: float, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """(a @ b) * inverse (+ bias) in float32 for fp8-valued float32 `a` (m, k), `b` (k, n) and inverse =
    inverse_scale(a_scale, b_scale): the product torch._scaled_mm computes. Every fp8 value is exactly a bfloat16, so
    oneDNN's bf16-input matmul (float32 products and accumulation, float32 result; AMX / AVX512-BF16 where the CPU has
    them) multiplies the same values as a float32 matmul would, faster; the result is multiplied by the inverse scales
    (BLAS's alpha), as _scaled_mm applies them after accumulating."""
    with bf16_input_matmul():
        if bias is None:
            return torch.addmm(_ZERO.get(a.device), a, b, beta=0, alpha=inverse)
        return torch.addmm(bias.float(), a, b, alpha=inverse)


@functools.lru_cache(maxsize=1)
def bf16_matmul_supported() -> bool:
    """Whether torch can run float32 matmuls with bf16 inputs here (oneDNN with bf16 support on this CPU)."""
    try:
        return (torch.backends.mkldnn.is_available() and hasattr(torch.backends.mkldnn, "matmul")
                and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))
    except (AttributeError, RuntimeError):
        return False


@contextlib.contextmanager
def bf16_input_matmul() -> Iterator[None]:
    """float32 matmuls inside take bf16 inputs (exact for fp8-valued operands, and only meant for them); the setting
    is torch's process-wide one, restored on exit. Nothing changes where the CPU or torch cannot."""
    if not bf16_matmul_supported():
        yield
        return
    settings = torch.backends.mkldnn.matmul
    previous = settings.fp32_precision
    settings.fp32_precision = "bf16"
    try:
        yield
    finally:
        settings.fp32_precision = previous


class _Zeros:
    """One 0-dim zero per device: the (ignored, beta=0) input of addmm."""

    def __init__(self) -> None:
        self._by_device: dict[torch.device, torch.Tensor] = {}

    def get(self, device: torch.device) -> torch.Tensor:
        zero = self._by_device.get(device)
        if zero is None:
            zero = self._by_device[device] = torch.zeros((), device=device)
        return zero


_ZERO = _Zeros()


def amax_value(x: torch.Tensor) -> float:
    """max |x| as a Python float (exactly the float32 / bfloat16 value), in one pass over x (aminmax); 0.0 for an
    empty tensor, NaN when x holds a NaN."""
    if x.numel() == 0:
        return 0.0
    low, high = torch.aminmax(x.detach())
    low_value, high_value = low.item(), high.item()
    return max(-low_value, high_value) if low_value == low_value and high_value == high_value else math.nan


def max_with_nan(values: list[float]) -> float:
    """max(values), NaN when one is NaN (as torch's amax), 0.0 for none."""
    if any(v != v for v in values):
        return math.nan
    return max(values, default=0.0)


def scale_value(amax_of_tensor: float, dtype: torch.dtype, margin: int = 0) -> float:
    """`scale_from_amax(torch.tensor(amax), dtype, margin)` as a Python float, computed in the same float32 steps
    (reciprocal of the clamped amax, times fp8_max, over 2**margin; float32 rounding of double results is exact for
    these operations on float32 values)."""
    if math.isfinite(amax_of_tensor) and amax_of_tensor > 0:
        clamped = max(to_float32(amax_of_tensor), torch.finfo(torch.float32).tiny)
        scale = to_float32(to_float32(1.0 / clamped) * fp8_max(dtype))
    else:
        scale = 1.0
    return to_float32(scale / 2.0**margin)


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

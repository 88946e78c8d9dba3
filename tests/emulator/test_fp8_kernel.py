"""The fused fp8 rounding kernel of the emulated device (torch.ops.hpu_emu.fp8_round_amax): one pass that rounds
x * scale to the fp8 grid and takes max |x|, bitwise the pure-torch passes it replaces (numerics.quantize_to_grid,
amax_value) and the float8 cast, on cpu and hpu tensors, float32 and bfloat16 inputs, both formats; its refusals;
quantize_with_amax's fallback; fp8 training with the kernel equal to training with the torch passes."""

from __future__ import annotations

import math

import pytest
import torch

from hpu_nb.emulator.fp8 import numerics
from hpu_nb.emulator.fp8.numerics import (
    MANTISSA_BITS,
    MIN_NORMAL_EXPONENT,
    amax_value,
    fp8_max,
    fused_rounding_applies,
    fused_rounding_kernel,
    quantize,
    quantize_to_grid,
    quantize_with_amax,
    torch_rounding_passes,
)
from hpu_nb.runtime import get_backend

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
SCALES = (1.0, 3.7, 1 / 1024, 2.0**20, 0.3)  # 3.7 / 0.3: not float32 values, both paths round them to float32 alike


@pytest.fixture
def kernel():
    get_backend()  # loads the emulated device's library (built from the current source)
    op = fused_rounding_kernel()
    assert op is not None, "the emulated device's library has no fp8_round_amax"
    return op


def run_kernel(op, x: torch.Tensor, scale: float, dtype: torch.dtype) -> tuple[torch.Tensor, float]:
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    amax = op(x, numerics.to_float32(scale), MANTISSA_BITS[dtype], MIN_NORMAL_EXPONENT[dtype], fp8_max(dtype), out)
    return out, amax


def hard_inputs(dtype: torch.dtype, n: int = 100_000) -> torch.Tensor:
    """Random values over 1e-12..1e6, every fp8 value, the midpoints between neighbours (ties) and their float32
    neighbours, fp8 and float32 subnormals, values past the range, signed zeros, infinities and NaNs."""
    g = torch.Generator().manual_seed(1)
    spread = torch.randn(n, generator=g) * 10.0 ** (torch.rand(n, generator=g) * 18 - 12)
    values = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    values = values[torch.isfinite(values)].unique().sort().values
    midpoints = (values[1:] + values[:-1]) / 2
    limit = fp8_max(dtype)
    edges = torch.tensor([0.0, -0.0, limit, -limit, limit * 1.01, -limit * 7, 1e-40, -1e-45, 2.0**-126,
                          float("inf"), -float("inf"), float("nan"), -float("nan")])
    return torch.cat([spread, values, midpoints, torch.nextafter(midpoints, torch.tensor(0.0)),
                      torch.nextafter(midpoints, torch.tensor(math.inf)), edges])


def assert_bitwise(got: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal bits, except that NaNs need only both be NaN (their payload is the CPU's business)."""
    nan = torch.isnan(expected)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got.view(torch.int32)[~nan], expected.view(torch.int32)[~nan])


@pytest.mark.parametrize("dtype", FP8)
def test_kernel_is_bitwise_the_torch_passes_and_the_float8_cast(kernel, dtype) -> None:
    x = hard_inputs(dtype)
    for scale in SCALES:
        got, amax = run_kernel(kernel, x, scale, dtype)
        assert_bitwise(got, quantize_to_grid(x, scale, dtype))
        cast = quantize(x, torch.tensor(numerics.to_float32(scale)), dtype).float()
        assert torch.equal(got.nan_to_num(7.0), cast.nan_to_num(7.0))  # values (+0 / -0 equal), NaN where NaN
        number = ~torch.isnan(cast)
        assert torch.equal(got.view(torch.int32)[number] & 0x7FFFFFFF, cast.view(torch.int32)[number] & 0x7FFFFFFF)
        assert math.isnan(amax)  # x holds a NaN
    finite = x[torch.isfinite(x)]
    _, amax = run_kernel(kernel, finite, 1.0, dtype)
    assert amax == amax_value(finite) == finite.abs().max().item()


@pytest.mark.parametrize("dtype", FP8)
def test_bfloat16_inputs_and_hpu_tensors(kernel, dtype) -> None:
    x = hard_inputs(dtype, 20_000)
    xb = x.bfloat16()
    for scale in (1.0, 3.7):
        got, amax = run_kernel(kernel, xb, scale, dtype)
        assert_bitwise(got, quantize_to_grid(xb, scale, dtype))
        assert math.isnan(amax)
        on_hpu, hpu_amax = run_kernel(kernel, x.to("hpu"), scale, dtype)
        assert on_hpu.device.type == "hpu" and math.isnan(hpu_amax)
        assert_bitwise(on_hpu.cpu(), quantize_to_grid(x, scale, dtype))
    finite = xb[torch.isfinite(xb)].to("hpu")
    _, amax = run_kernel(kernel, finite, 2.0, dtype)
    assert amax == amax_value(finite) == finite.float().abs().max().item()


def test_amax_of_special_tensors(kernel) -> None:
    cases = {
        (): 0.0,
        (0.0, -0.0): 0.0,
        (-3.0, 2.0): 3.0,
        (1.0, -float("inf")): math.inf,
        (-1e-45,): 1e-45,  # a float32 subnormal
    }
    for values, expected in cases.items():
        x = torch.tensor(values, dtype=torch.float32)
        _, amax = run_kernel(kernel, x, 1.0, FP8[0])
        assert amax == numerics.to_float32(expected) == amax_value(x)
    assert math.isnan(run_kernel(kernel, torch.tensor([1.0, float("nan"), 5.0]), 1.0, FP8[1])[1])


def test_large_tensors_split_across_threads(kernel) -> None:
    """Larger than one block (65536 elements): the blocks' amaxes are combined, wherever the largest value sits."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        g = torch.Generator().manual_seed(2)
        x = torch.randn(3 * 65536 + 17, generator=g)
        for where in (0, 65535, 65536, 2 * 65536 + 5, x.numel() - 1):
            y = x.clone()
            y[where] = -1234.5
            got, amax = run_kernel(kernel, y, 0.25, FP8[0])
            assert amax == 1234.5
            assert_bitwise(got, quantize_to_grid(y, 0.25, FP8[0]))
    finally:
        torch.set_num_threads(threads)


def test_non_contiguous_input_and_2d_shapes(kernel) -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 96, generator=g) * 40
    t = x.t()  # not contiguous
    got, amax = run_kernel(kernel, t, 3.0, FP8[1])
    assert got.shape == t.shape and amax == x.abs().max().item()
    assert_bitwise(got, quantize_to_grid(t, 3.0, FP8[1]))


def test_kernel_refusals(kernel) -> None:
    x = torch.ones(4)
    args = (1.0, 3, -6, 448.0)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        kernel(x.double(), *args, torch.empty(4))
    with pytest.raises(RuntimeError, match="out must be"):
        kernel(x, *args, torch.empty(4, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="out must be"):
        kernel(x, *args, torch.empty(5))
    with pytest.raises(RuntimeError, match="out must be"):
        kernel(torch.ones(4, 4), *args, torch.empty(4, 4).t())
    with pytest.raises(RuntimeError, match="different devices"):
        kernel(x, *args, torch.empty(4, device="hpu"))
    with pytest.raises(RuntimeError, match="small float format"):
        kernel(x, 1.0, 0, -6, 448.0, torch.empty(4))
    with pytest.raises(RuntimeError, match="small float format"):
        kernel(x, 1.0, 3, 2, 448.0, torch.empty(4))


@pytest.mark.parametrize("dtype", FP8)
def test_quantize_with_amax_same_with_and_without_the_kernel(kernel, dtype, monkeypatch) -> None:
    x = hard_inputs(dtype, 5_000)
    finite = x[torch.isfinite(x)]
    fused_out, fused_amax = quantize_with_amax(finite, 3.7, dtype)
    assert fused_rounding_applies(finite)
    with torch_rounding_passes():
        assert not fused_rounding_applies(finite)
        torch_out, torch_amax = quantize_with_amax(finite, 3.7, dtype)
        assert quantize_with_amax(finite, 3.7, dtype, need_amax=False)[1] is None
    assert fused_rounding_applies(finite)  # restored
    assert_bitwise(fused_out, torch_out)
    assert fused_amax == torch_amax == amax_value(finite)
    reused = torch.empty_like(finite)  # an `out` that fits is written; one that does not is replaced
    assert quantize_with_amax(finite, 3.7, dtype, out=reused)[0] is reused
    assert quantize_with_amax(finite, 3.7, dtype, out=torch.empty(3))[0].shape == finite.shape
    assert not fused_rounding_applies(finite.double())  # other dtypes take the torch passes
    assert_bitwise(quantize_with_amax(finite.half(), 3.7, dtype)[0], quantize_to_grid(finite.half(), 3.7, dtype))
    monkeypatch.setattr(numerics, "_fused_kernel", None)  # an older library without the op: the torch passes run
    monkeypatch.setattr(numerics, "FUSED_KERNEL", ("hpu_emu", "fp8_round_amax_of_a_later_release"))
    assert fused_rounding_kernel() is None and not fused_rounding_applies(finite)
    old_out, old_amax = quantize_with_amax(x, 3.7, dtype)
    assert_bitwise(old_out, quantize_to_grid(x, 3.7, dtype))
    assert math.isnan(old_amax)


def _train(te, steps: int, device: str) -> tuple[list[torch.Tensor], torch.nn.Module]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(te.Linear(64, 48), torch.nn.ReLU(), te.Linear(48, 32)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(5)
    seen = []
    recipe = te.recipe.DelayedScaling(amax_history_len=4)
    for _ in range(steps):
        x = (torch.randn(16, 64, generator=g) * 3).to(device).requires_grad_()
        with te.fp8_autocast(enabled=True, fp8_recipe=recipe):
            out = model(x)
        (out.float() ** 2).mean().backward()
        seen += [out.detach().cpu(), x.grad.cpu()] + [p.grad.detach().cpu() for p in model.parameters()]
        optimizer.step()
        optimizer.zero_grad()
    return seen, model


@pytest.mark.parametrize("device", ["cpu", "hpu"])
def test_fp8_training_with_the_kernel_is_training_with_the_torch_passes(kernel, device) -> None:
    import habana_frameworks.torch.hpex.experimental.transformer_engine as te

    te.fp8.FP8GlobalStateManager.reset_global_state()
    fused, fused_model = _train(te, 3, device)
    with torch_rounding_passes():
        reference, reference_model = _train(te, 3, device)
    te.fp8.FP8GlobalStateManager.reset_global_state()
    assert len(fused) == len(reference)
    for got, expected in zip(fused, reference):
        assert torch.equal(got, expected)  # outputs, input and parameter gradients, step after step
    for a, b in zip(fused_model.modules(), reference_model.modules()):
        if hasattr(a, "amax_history"):
            assert torch.equal(a.amax_history, b.amax_history) and torch.equal(a.scale, b.scale)
            assert a.amax_history[:3].abs().sum() > 0  # amaxes were recorded


def test_the_fp8_layers_quantise_through_the_kernel(kernel, monkeypatch) -> None:
    """One training step of te.Linear on hpu: input and weight (forward) and the gradient (backward) each take one
    kernel pass, and no torch amax pass runs."""
    import habana_frameworks.torch.hpex.experimental.transformer_engine as te

    from hpu_nb.emulator.fp8 import training

    calls: list[tuple[torch.dtype, tuple[int, ...]]] = []

    def counting(x, *args):
        calls.append((x.dtype, tuple(x.shape)))
        return kernel(x, *args)

    def no_torch_amax(x):
        raise AssertionError("a separate amax pass ran")

    monkeypatch.setattr(numerics, "_fused_kernel", counting)
    monkeypatch.setattr(numerics, "amax_value", no_torch_amax)
    monkeypatch.setattr(training, "amax_value", no_torch_amax)
    te.fp8.FP8GlobalStateManager.reset_global_state()
    layer = te.Linear(32, 16).to("hpu")
    x = torch.randn(4, 32, device="hpu", dtype=torch.bfloat16, requires_grad=True)
    with te.fp8_autocast(enabled=True):
        out = layer(x)
    out.float().sum().backward()
    te.fp8.FP8GlobalStateManager.reset_global_state()
    assert sorted(calls, key=str) == sorted([(torch.bfloat16, (4, 32)), (torch.float32, (16, 32)),
                                             (torch.bfloat16, (4, 16))], key=str)
    assert x.grad is not None and layer.weight.grad is not None

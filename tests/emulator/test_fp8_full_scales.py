"""fp8 on the emulated Gaudi takes its generation's full scale and hardware-aligned scales (runtime.generations owns
them), and torch.compile traces the emulated transformer engine.

Gaudi2's e4m3 ends at 240 (Intel Neural Compressor's fp_utils.get_fullscale takes float8_e4m3fnuz's range there; the
bridge's quantizer and fp8 AdamW use 240), Gaudi3's at 448. INC's maxabs scale methods (scale_method_config.py,
round_scales_function.py) are restated below from its source, independently of hpu_nb's code, and hpu_nb's scales are
checked against them. Before, the emulated paths scaled e4m3 to torch's 448 on every generation.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from hpu_nb.emulator.fp8 import numerics
from hpu_nb.emulator.fp8.numerics import inc_scale, quantize, scale_from_amax, scale_value
from hpu_nb.runtime import get_backend, reset_backend
from hpu_nb.runtime.generations import GENERATIONS

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FULL_SCALE = {"gaudi2": 240.0, "gaudi3": 448.0}


@pytest.fixture(params=["gaudi2", "gaudi3"])
def generation(request, monkeypatch):
    """The emulated card is this generation for the test (back to the default Gaudi2 afterwards)."""
    monkeypatch.setenv("HPU_NB_DEVICE", request.param)
    reset_backend()
    get_backend()
    yield request.param
    monkeypatch.delenv("HPU_NB_DEVICE")
    reset_backend()
    get_backend()


def test_scale_from_amax_of_one_is_the_generations_e4m3_full_scale(generation) -> None:
    full = FULL_SCALE[generation]
    assert scale_from_amax(torch.tensor(1.0), E4M3).item() == full  # 448.0 on an emulated Gaudi2 before
    assert scale_value(1.0, E4M3) == full and numerics.fp8_max(E4M3) == full
    assert scale_from_amax(torch.tensor(1.0), E5M2).item() == 57344.0
    # what Gaudi2 cannot hold saturates at its full scale
    assert quantize(torch.tensor([1000.0, -1000.0]), torch.tensor(1.0), E4M3).float().tolist() == [full, -full]


def test_te_linear_scales_its_operands_to_the_generations_full_scale(generation) -> None:
    import habana_frameworks.torch.hpex.experimental.transformer_engine as te

    te.fp8.FP8GlobalStateManager.reset_global_state()
    layer = te.Linear(4, 4, bias=False).to("hpu")
    with torch.no_grad():
        layer.weight.fill_(0.5)
    with te.fp8_autocast(enabled=True):
        for _ in range(2):  # the second step folds the first step's amaxes into the scales (delayed scaling)
            layer(torch.full((2, 4), 2.0, device="hpu")).float().sum().backward()
    full = FULL_SCALE[generation]
    assert layer.scale[:2].tolist() == [full / 2.0, full / 0.5]


# -- INC's formula, restated from neural_compressor/torch/algorithms/fp8_quant/_core ------------------------------
INC_EXP_BIAS = {"gaudi2": [3, 7, 11, 15], "gaudi3": list(range(63))}  # fp_utils.EXP_BIAS_SETS, e4m3
INC_SCALE_FACTOR = {"gaudi2": 4, "gaudi3": 1}  # fp_utils.DEVICES_SCALE_FACTORS


def inc_reference(amax: float, generation: str, method: str, backoff: float) -> float:
    """INC's scale (a divisor) for a per-tensor maxabs method: amax / (fullscale * backoff), then POW2's
    2**ceil(log2 s) or HW_ALIGNED's 2**(ceil(log2(pow2) / factor) * factor) clamped to the hardware-aligned scales
    fullscale(bias) / fullscale(default bias 7) = 2**(7 - bias)."""
    scale = amax / (FULL_SCALE[generation] * backoff)
    if method == "maxabs_arbitrary":
        return scale
    pow2 = 2.0 ** math.ceil(math.log2(scale))
    if method == "maxabs_pow2":
        return pow2
    aligned = [2.0 ** (7 - bias) for bias in INC_EXP_BIAS[generation]]
    factor = INC_SCALE_FACTOR[generation]
    return min(max(2.0 ** (math.ceil(math.log2(pow2) / factor) * factor), min(aligned)), max(aligned))


AMAXES = [1e-5, 3e-4, 0.003, 0.1, 0.7, 1.0, 7.0, 100.0, 5000.0, 1e6]


@pytest.mark.parametrize("gen", ["gaudi2", "gaudi3"])
@pytest.mark.parametrize("method", ["maxabs_hw", "maxabs_pow2", "maxabs_arbitrary"])
@pytest.mark.parametrize("backoff", [0.5, 0.25])
def test_inc_scales_follow_incs_formula(gen, method, backoff) -> None:
    generation = GENERATIONS[gen]
    got = [inc_scale(torch.tensor(a), E4M3, method, backoff, generation).item() for a in AMAXES]
    expected = [inc_reference(a, gen, method, backoff) for a in AMAXES]
    assert got == pytest.approx(expected, rel=1e-6)
    if method == "maxabs_hw" and gen == "gaudi2":  # Gaudi2 picks from its 4 hardware-aligned scales only
        assert set(got) <= {16.0, 1.0, 1 / 16, 1 / 256} and len(set(got)) == 4
    assert inc_scale(torch.tensor(0.0), E4M3, method, backoff, generation).item() == 1.0


def test_generations_own_the_hardware_aligned_scales() -> None:
    assert GENERATIONS["gaudi2"].fp8_hw_scales("E4M3") == (16.0, 1.0, 1 / 16, 1 / 256)
    assert GENERATIONS["gaudi2"].fp8_hw_scales("E5M2") == (1.0,)
    gaudi3 = GENERATIONS["gaudi3"].fp8_hw_scales("E4M3")
    assert (len(gaudi3), max(gaudi3), min(gaudi3)) == (63, 2.0**7, 2.0**-55)
    with pytest.raises(ValueError, match="fp8 is not supported on GAUDI"):
        GENERATIONS["gaudi"].fp8_hw_scales("E4M3")


@pytest.mark.parametrize("method", ["maxabs_hw", "maxabs_pow2", "maxabs_arbitrary"])
def test_quantized_linear_takes_incs_scales_on_the_emulated_card(generation, method) -> None:
    from hpu_nb.emulator.fp8.engine import Fp8QuantLinear

    torch.manual_seed(0)
    linear = torch.nn.Linear(16, 8)
    layer = Fp8QuantLinear(linear, input_amax=3.0, scale_method=method)
    w_amax = linear.weight.detach().abs().max().item()
    assert 1 / layer.weight_scale.item() == pytest.approx(inc_reference(w_amax, generation, method, 0.5), rel=1e-6)
    assert 1 / layer.input_scale.item() == pytest.approx(inc_reference(3.0, generation, method, 0.25), rel=1e-6)
    assert layer.weight_fp8.float().abs().max().item() <= FULL_SCALE[generation]
    x = torch.randn(4, 16).clamp(-3, 3)
    error = numerics.relative_error(layer(x).float(), linear(x).detach())
    assert error < 0.1


# -- torch.compile of an fp8 model (the fused rounding kernel traced through its fake kernel) --------------------------
def fp8_model_outputs(compile_it: bool) -> tuple[list[torch.Tensor], list[list[float]]]:
    import habana_frameworks.torch.hpex.experimental.transformer_engine as te

    te.fp8.FP8GlobalStateManager.reset_global_state()
    torch.manual_seed(0)
    model = torch.nn.Sequential(te.Linear(16, 32), torch.nn.ReLU(), te.Linear(32, 4)).to("hpu")
    model = copy.deepcopy(model)
    run = torch.compile(model, backend="hpu_backend") if compile_it else model
    outputs = []
    for step in range(3):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step)).to("hpu") * (step + 1)
        with te.fp8_autocast(enabled=True):
            y = run(x)
        y.float().sum().backward()
        outputs.append(y.detach().cpu())
    return outputs, [layer.scale.tolist() for layer in (model[0], model[2])]


def test_torch_compile_of_an_fp8_model_matches_eager(fresh_compiler) -> None:
    """It failed ("TorchRuntimeError ... fake tensor call"): the C++ op hpu_emu::fp8_round_amax is a catch-all kernel
    with no fake kernel, and torch lets none be added to it. Compiled, the rounding goes through hpu_nb's traceable
    op, whose fake kernel gives the shapes; the outputs and the delayed-scaling state are eager's, bit for bit."""
    get_backend()
    if numerics.fused_rounding_kernel() is None:
        pytest.skip("the emulated device's library has no fused fp8 rounding kernel here")
    eager, eager_scales = fp8_model_outputs(compile_it=False)
    compiled, compiled_scales = fp8_model_outputs(compile_it=True)
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled)) and eager_scales == compiled_scales
    assert eager_scales[0] != [1.0, 1.0, 1.0]  # the scales moved: the amaxes came back from the compiled steps


def test_the_traceable_rounding_op_has_a_fake_kernel_and_the_cpp_op_none(fresh_compiler) -> None:
    """Under FakeTensorMode (what torch.compile traces with) the traceable op answers with shapes; the C++ op runs its
    body on data-less tensors and fails, which is what compiling an fp8 model hit."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    get_backend()
    kernel = numerics.fused_rounding_kernel()
    if kernel is None:
        pytest.skip("the emulated device's library has no fused fp8 rounding kernel here")
    with FakeTensorMode():
        x, out = torch.empty(4, 8), torch.empty(4, 8)
        amax = torch.ops.hpu_nb.fp8_round_amax(x, 2.0, 3, -6, 240.0, out)
        assert amax.shape == () and amax.dtype == torch.float32
        with pytest.raises(Exception, match="data"):
            kernel(x, 2.0, 3, -6, 240.0, out)
    x = torch.tensor([[0.3, -5.0]])
    out = torch.empty_like(x)
    amax = torch.ops.hpu_nb.fp8_round_amax(x, 2.0, 3, -6, 240.0, out)
    assert amax.item() == 5.0 and out.tolist() == numerics.quantize_to_grid(x, 2.0, E4M3).tolist()


def test_without_the_fake_kernel_compiling_an_fp8_model_fails(fresh_compiler, monkeypatch) -> None:
    """The compile test above fails where the traced rounding calls the C++ op directly (no fake kernel)."""
    get_backend()
    kernel = numerics.fused_rounding_kernel()
    if kernel is None:
        pytest.skip("the emulated device's library has no fused fp8 rounding kernel here")

    def untraceable(x, scale, mantissa_bits, min_normal_exponent, fp8_max, out):
        return torch.tensor(kernel(x, scale, mantissa_bits, min_normal_exponent, fp8_max, out))

    monkeypatch.setattr(numerics, "traceable_round_amax", untraceable)
    with pytest.raises(Exception, match="fake tensor call"):
        fp8_model_outputs(compile_it=True)


def test_a_trainer_fits_a_compiled_fp8_model(tmp_path, fresh_compiler) -> None:
    """What lightning-habana's users do (its test_compile's fp8 case): convert the model's layers for fp8, compile it
    with hpu_backend, fit. It failed on the emulated Gaudi with "RuntimeError when making fake tensor call"."""
    import habana_frameworks.torch.hpex.experimental.transformer_engine as te
    from lightning.pytorch import Trainer
    from lightning.pytorch.demos.boring_classes import BoringModel

    from hpu_nb import HPUAccelerator, HPUPrecisionPlugin, SingleHPUStrategy

    model = BoringModel()
    plugin = HPUPrecisionPlugin(precision="fp8")
    plugin.convert_modules(model, replace_layers=True)
    assert isinstance(model.layer, te.Linear)
    before = model.layer.weight.detach().clone()
    trainer = Trainer(default_root_dir=tmp_path, accelerator=HPUAccelerator(), strategy=SingleHPUStrategy(),
                      devices=1, max_steps=1, limit_val_batches=0, plugins=plugin, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(torch.compile(model, backend="hpu_backend"))
    assert trainer.global_step == 1 and not torch.equal(model.layer.weight.detach().cpu(), before.cpu())

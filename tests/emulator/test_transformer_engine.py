"""The emulated transformer engine (habana_frameworks.torch.hpex.experimental.transformer_engine): te.Linear against
nn.Linear and against the float8 / torch._scaled_mm reference, fp8_autocast and FP8GlobalStateManager, the recipe,
the first-generation refusal, HPUPrecisionPlugin going through it, and the plugin's fp8 training example as written."""

from __future__ import annotations

import statistics

import pytest
import torch

from hpu_nb.emulator.fp8.numerics import (
    MANTISSA_BITS,
    fp8_grid_mm,
    fp8_max,
    inverse_scale,
    quantize,
    quantize_to_grid,
    relative_error,
    round_to_fp8_grid,
    scale_from_amax,
    scaled_mm,
)
from hpu_nb.runtime import get_backend, reset_backend
from tests.helpers.models import quiet_trainer_kwargs

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
U = 2.0**-24  # float32 unit roundoff


@pytest.fixture
def te():
    get_backend()  # the emulated Gaudi2 of conftest's clean environment
    import habana_frameworks.torch.hpex.experimental.transformer_engine as te

    te.fp8.FP8GlobalStateManager.reset_global_state()
    yield te
    te.fp8.FP8GlobalStateManager.reset_global_state()


def test_the_emulated_module_is_the_one_imported(te) -> None:
    assert te.__emulated__ and te.recipe.__emulated__ and te.fp8.__emulated__
    from habana_frameworks.torch.hpex.experimental.transformer_engine.recipe import DelayedScaling, Format

    assert DelayedScaling is te.recipe.DelayedScaling and Format is te.recipe.Format
    assert "habana_frameworks.torch.hpex.experimental.transformer_engine" in te.Linear.__module__


# -- the fast fp8 numerics are the float8 / _scaled_mm numerics --------------------------------------------------------
def _every_fp8_value_and_midpoint(dtype: torch.dtype) -> torch.Tensor:
    values = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    values = values[torch.isfinite(values)].unique().sort().values
    midpoints = (values[1:] + values[:-1]) / 2  # exact ties: round to nearest even decides
    return torch.cat([values, midpoints, torch.nextafter(midpoints, torch.tensor(0.0)),
                      torch.nextafter(midpoints, torch.tensor(float("inf")))])


@pytest.mark.parametrize("dtype", FP8)
def test_grid_rounding_is_bitwise_the_float8_cast(dtype) -> None:
    g = torch.Generator().manual_seed(0)
    spread = torch.randn(200_000, generator=g) * 10.0 ** (torch.rand(200_000, generator=g) * 18 - 12)  # 1e-12..1e6
    limit = fp8_max(dtype)
    edges = torch.tensor([0.0, -0.0, limit, -limit, limit * 1.01, -limit * 7, float("inf"), -float("inf"), 1e-40])
    x = torch.cat([spread, _every_fp8_value_and_midpoint(dtype), edges])
    for scale in (torch.tensor(1.0), torch.tensor(3.7), torch.tensor(1 / 1024)):
        expected = quantize(x, scale, dtype).float()
        got = quantize_to_grid(x, scale, dtype)
        assert torch.equal(got.view(torch.int32) & 0x7FFFFFFF, expected.view(torch.int32) & 0x7FFFFFFF)  # bitwise;
        assert torch.equal(got, expected)  # ... and +0 / -0 compare equal
    finite = x[torch.isfinite(x)]
    amax = finite.abs().max()
    scale = scale_from_amax(amax, dtype)  # in range: the clamp may be skipped, nothing changes
    assert torch.equal(quantize_to_grid(finite, scale, dtype, x_amax=amax), quantize(finite, scale, dtype).float())
    scratch = torch.empty_like(finite)  # a reused work space changes nothing
    assert torch.equal(quantize_to_grid(finite, scale, dtype, scratch=scratch), quantize(finite, scale, dtype).float())
    with pytest.raises(TypeError, match="float32"):
        round_to_fp8_grid(torch.ones(2, dtype=torch.bfloat16), dtype)


def test_grid_matmul_is_scaled_mm_bitwise_when_float32_sums_are_exact() -> None:
    """Small integer fp8 operands: every partial sum is an integer below 2**24, so float32 accumulation is exact in any
    order and the two paths must agree bit for bit (power-of-two scales: the rescaling is exact too)."""
    g = torch.Generator().manual_seed(1)
    a = torch.randint(-15, 16, (24, 40), generator=g).float()  # exact in E4M3 (3 mantissa bits)
    b = torch.randint(-7, 8, (40, 16), generator=g).float()  # exact in E5M2 (2 mantissa bits)
    sa, sb = torch.tensor(4.0), torch.tensor(0.5)
    qa, qb = quantize(a, sa, torch.float8_e4m3fn), quantize(b, sb, torch.float8_e5m2)
    reference = scaled_mm(qa, qb, sa, sb, torch.float32)
    fast = fp8_grid_mm(qa.float(), qb.float(), inverse_scale(sa, sb))
    assert torch.equal(fast, reference) and torch.equal(fast, a @ b)


@pytest.mark.parametrize("k", [64, 512])
def test_grid_matmul_is_scaled_mm_within_float32_summation_error(k: int) -> None:
    """General operands: the same exact products summed in float32 in another order. Each result differs from the
    exact sum by at most gamma_k * sum|a_i b_i| (gamma_k = k u / (1 - k u)), so the two differ by at most twice that,
    plus the final rescaling's rounding. Not bitwise: the summation order is the matmul library's (oneDNN's bf16-input
    path where the CPU has one), not _scaled_mm's."""
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(16, k, generator=g) * 3, torch.randn(24, k, generator=g) / 5
    sx, sw = scale_from_amax(x.abs().max(), FP8[0]), scale_from_amax(w.abs().max(), FP8[0])
    qx, qw = quantize(x, sx, FP8[0]), quantize(w, sw, FP8[0])
    reference = scaled_mm(qx, qw.t(), sx, sw, torch.float32)
    fast = fp8_grid_mm(quantize_to_grid(x, sx, FP8[0]), quantize_to_grid(w, sw, FP8[0]).t(), inverse_scale(sx, sw))
    magnitude = (qx.float().abs() @ qw.float().abs().t()) / (sx * sw)
    gamma = k * U / (1 - k * U)
    bound = 2 * gamma * magnitude + 4 * U * reference.abs()
    assert torch.all((fast - reference).abs() <= bound)
    assert not torch.equal(fast, x @ w.t())  # it really is the fp8 product, not the float32 one
    one = torch.tensor(1.0)
    assert inverse_scale(sx, sw) == ((one / sx) * (one / sw)).item()  # the float32 factor _scaled_mm is given


def test_bf16_input_matmuls_stay_inside_the_fp8_layers(te) -> None:
    """The bf16-input setting is process-wide in torch: it must be restored, so the model's other float32 matmuls are
    exact float32 ones."""
    settings = getattr(torch.backends.mkldnn, "matmul", None)
    before = getattr(settings, "fp32_precision", None)
    layer = te.Linear(64, 64)
    x = torch.randn(8, 64, requires_grad=True)
    with te.fp8_autocast(enabled=True):
        layer(x).float().sum().backward()
    assert getattr(settings, "fp32_precision", None) == before
    a, b = torch.randn(32, 64), torch.randn(64, 16)
    exact = (a.double() @ b.double()).float()
    assert (a @ b - exact).abs().max().item() < 1e-4  # a bf16-input product would be off by ~1e-2


def _reference_fp8_linear(x, weight, bias, sx, sw):
    """What te.Linear computes, written with float8 casts and torch._scaled_mm (the reference path), in float32."""
    out = scaled_mm(quantize(x, sx, FP8[0]), quantize(weight, sw, FP8[0]).t(), sx, sw, torch.float32)
    return out + bias.float()


def test_te_linear_is_the_scaled_mm_reference_forward_and_backward(te) -> None:
    torch.manual_seed(0)
    layer = te.Linear(48, 24)
    x = torch.randn(8, 48) * 2
    g = torch.randn(8, 24)
    with te.fp8_autocast(enabled=True, fp8_recipe=te.recipe.DelayedScaling(amax_history_len=4)):
        for _ in range(2):  # the second step runs on scales the first step's amaxes chose
            xr = x.clone().requires_grad_()
            layer.zero_grad()
            out = layer(xr)
            out.float().backward(g)
    sx, sw, sg = layer.scale.tolist()
    assert [sx, sw, sg] == [scale_from_amax(x.abs().max(), FP8[0]).item(),
                            scale_from_amax(layer.weight.detach().abs().max(), FP8[0]).item(),
                            scale_from_amax(g.abs().max(), FP8[1]).item()]
    assert layer.amax_history[0].tolist() == [x.abs().max().item(), layer.weight.abs().max().item(),
                                              g.abs().max().item()]  # amaxes recorded exactly
    s = [torch.tensor(v) for v in (sx, sw, sg)]
    reference = _reference_fp8_linear(x, layer.weight.detach(), layer.bias.detach(), s[0], s[1])
    assert out.dtype == torch.float32  # the activation dtype: float32 in, no autocast
    assert torch.allclose(out, reference, rtol=1e-5, atol=1e-6)
    gq = quantize(g, s[2], FP8[1])
    grad_x = scaled_mm(gq, quantize(layer.weight.detach(), s[1], FP8[0]), s[2], s[1], torch.float32)
    grad_w = scaled_mm(gq.t().contiguous(), quantize(x, s[0], FP8[0]), s[2], s[0], torch.float32)
    assert torch.allclose(xr.grad, grad_x, rtol=1e-5, atol=1e-6)
    assert torch.allclose(layer.weight.grad, grad_w, rtol=1e-5, atol=1e-6)
    assert torch.allclose(layer.bias.grad, g.sum(0))


def test_te_linear_returns_the_activation_dtype(te) -> None:
    """As the transformer engine's Linear: autocast's dtype where autocast is on, else the input's; the gradient
    reaching the input has the input's dtype (lightning-habana's tests assert float32 on Gaudi 2)."""
    layer = te.Linear(16, 8)
    for dtype, autocast, expected in ((torch.float32, False, torch.float32), (torch.float32, True, torch.bfloat16),
                                      (torch.bfloat16, False, torch.bfloat16)):
        x = torch.randn(4, 16, dtype=dtype, requires_grad=True)
        with te.fp8_autocast(enabled=True), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = layer(x)
        out.float().sum().backward()
        assert (out.dtype, x.grad.dtype) == (expected, dtype)


def test_te_linear_against_nn_linear(te) -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 32)
    layer = te.Linear(64, 32)
    layer.load_state_dict(linear.state_dict(), strict=False)
    x = torch.randn(16, 64)
    assert torch.equal(layer(x), linear(x)) and layer(x).dtype == torch.float32  # outside fp8: a plain linear
    with te.fp8_autocast(enabled=True):
        for _ in range(2):
            x1 = x.clone().requires_grad_()
            out = layer(x1)
            (out.float() ** 2).sum().backward()
    x2 = x.clone().requires_grad_()
    ref = linear(x2)
    (ref**2).sum().backward()
    assert out.dtype == torch.float32  # the activation dtype
    assert 1e-3 < relative_error(out, ref) < 0.06  # E4M3 forward: 3 mantissa bits, visible and bounded
    assert 1e-3 < relative_error(x1.grad, x2.grad) < 0.15  # E5M2 gradients: 2 mantissa bits


def test_te_linear_arguments_as_habana_and_optimum_habana_use_them(te) -> None:
    source = torch.nn.Linear(8, 4)
    layer = te.Linear(8, 4, bias=True, params_dtype=torch.float32, skip_weight_param_allocation=True,
                      minimize_memory=False)
    assert layer.weight is None and layer.bias is None
    with pytest.raises(RuntimeError, match="skip_weight_param_allocation"):
        layer(torch.randn(2, 8))
    layer.weight, layer.bias = source.weight, source.bias  # optimum-habana's convert_model shares the Parameters
    x = torch.randn(2, 8)
    assert torch.equal(layer(x), source(x))
    assert torch.equal(te.Linear(8, 4, bias=False, skip_weight_param_allocation=True)(x, weight=source.weight),
                       x @ source.weight.t())
    out, bias = te.Linear(8, 4, return_bias=True)(x)
    assert out.shape == (2, 4) and bias.shape == (4,)
    assert te.Linear(8, 4, bias=False).bias is None
    assert te.Linear(8, 4, params_dtype=torch.bfloat16).weight.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="positive"):
        te.Linear(0, 4)
    with pytest.raises(TypeError):
        te.Linear(8, 4, no_such_option=True)
    assert te.distributed.activation_checkpointing()(lambda a: a + 1)(1) == 2  # optimum-habana wraps recomputes so


# -- fp8_autocast and FP8GlobalStateManager ----------------------------------------------------------------------------
def test_fp8_autocast_nests_and_restores(te) -> None:
    state = te.fp8.FP8GlobalStateManager
    assert not state.is_fp8_enabled() and state.get_fp8_recipe() is None and state.get_fp8_autocast_depth() == 0
    outer, inner = te.recipe.DelayedScaling(margin=1), te.recipe.DelayedScaling(margin=2)
    layer = te.Linear(8, 8)
    x = torch.randn(4, 8)
    with te.fp8_autocast(enabled=True, fp8_recipe=outer):
        assert state.is_fp8_enabled() and state.get_fp8_recipe() is outer and state.get_fp8_autocast_depth() == 1
        assert layer(x).dtype == torch.float32
        with te.fp8_autocast(enabled=False, fp8_recipe=inner):
            assert not state.is_fp8_enabled() and state.get_fp8_recipe() is inner
            assert state.get_fp8_autocast_depth() == 2
            assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
        assert state.is_fp8_enabled() and state.get_fp8_recipe() is outer
        with pytest.raises(KeyError), te.fp8_autocast(enabled=True):
            assert state.get_fp8_recipe() == te.recipe.DelayedScaling()  # None: the default recipe
            raise KeyError("inside")
        assert state.get_fp8_recipe() is outer and state.get_fp8_autocast_depth() == 1  # restored after an error
    assert not state.is_fp8_enabled() and state.get_fp8_recipe() is None and state.get_fp8_autocast_depth() == 0
    assert state.is_fp8_available() == (True, "")
    with pytest.raises(TypeError, match="DelayedScaling"), te.fp8_autocast(fp8_recipe={"margin": 1}):
        pass


def test_hpu_nb_helpers_read_the_same_state(te) -> None:
    from hpu_nb.core.fp8 import DelayedScaling
    from hpu_nb.emulator.fp8.engine import active_recipe
    from hpu_nb.emulator.fp8.training import fp8_enabled

    with te.fp8_autocast(enabled=True, fp8_recipe=te.recipe.DelayedScaling(margin=3, amax_history_len=16)):
        assert fp8_enabled() and active_recipe() == DelayedScaling(margin=3, amax_history_len=16)
    assert not fp8_enabled() and active_recipe() is None


# -- the recipe --------------------------------------------------------------------------------------------------------
def test_recipe_fields_and_formats(te) -> None:
    r = te.recipe.DelayedScaling()
    assert (r.margin, r.interval, r.fp8_format, r.amax_history_len, r.amax_compute_algo, r.reduce_amax) == (
        0, 1, te.recipe.Format.HYBRID, 1024, "max", True)
    Format = te.recipe.Format
    assert {f.name for f in Format} == {"E4M3", "E5M2", "HYBRID"}
    assert (Format.HYBRID.forward_dtype, Format.HYBRID.backward_dtype) == (torch.float8_e4m3fn, torch.float8_e5m2)
    assert (Format.E4M3.forward_dtype, Format.E4M3.backward_dtype) == (torch.float8_e4m3fn, torch.float8_e4m3fn)
    assert (Format.E5M2.forward_dtype, Format.E5M2.backward_dtype) == (torch.float8_e5m2, torch.float8_e5m2)
    r = te.recipe.DelayedScaling(fp8_format=Format.E5M2, amax_history_len=16, amax_compute_algo="most_recent",
                                 reduce_amax=False)
    r.backend = "TE"  # optimum-habana's get_fp8_recipe tags the recipe so
    assert (r.fp8_format, r.amax_history_len, r.amax_compute_algo) == (Format.E5M2, 16, "most_recent")
    with pytest.raises(TypeError, match="recipe.Format"):
        te.recipe.DelayedScaling(fp8_format="HYBRID")
    with pytest.raises(NotImplementedError, match="scaling_factor_compute_algo"):
        te.recipe.DelayedScaling(scaling_factor_compute_algo=lambda *a: a)
    with pytest.raises(ValueError, match="amax_compute_algo"), \
            te.fp8_autocast(fp8_recipe=te.recipe.DelayedScaling(amax_compute_algo=lambda history: history[0])):
        pass


@pytest.mark.parametrize(("fmt", "grad_dtype", "algo"), [("HYBRID", torch.float8_e5m2, "max"),
                                                         ("E4M3", torch.float8_e4m3fn, "most_recent")])
def test_the_recipe_decides_formats_history_and_margin(te, fmt, grad_dtype, algo) -> None:
    recipe = te.recipe.DelayedScaling(margin=1, fp8_format=getattr(te.recipe.Format, fmt), amax_history_len=3,
                                      amax_compute_algo=algo)
    layer = te.Linear(4, 4, bias=False)
    grads = []
    with te.fp8_autocast(enabled=True, fp8_recipe=recipe):
        for value in (2.0, 8.0, 4.0, 1.0):
            out = layer(torch.full((2, 4), value))
            grad = torch.full_like(out, value / 8)  # exact in bf16, the gradient's dtype at the layer
            grads.append(value / 8)
            out.float().backward(grad.float())
        layer(torch.ones(2, 4))  # folds the last step into the history
    assert layer.amax_history.shape == (3, 3)  # the recipe's history length
    assert layer.amax_history[:, 0].tolist() == [1.0, 4.0, 8.0]  # newest first, the oldest (2.0) dropped
    chosen = 8.0 if algo == "max" else 1.0
    assert layer.scale[0].item() == pytest.approx(fp8_max(torch.float8_e4m3fn) / chosen / 2)
    g_chosen = max(grads[1:]) if algo == "max" else grads[-1]
    assert layer.scale[2].item() == pytest.approx(fp8_max(grad_dtype) / g_chosen / 2, rel=1e-6)
    assert MANTISSA_BITS[grad_dtype] == (2 if fmt == "HYBRID" else 3)


# -- first-generation Gaudi --------------------------------------------------------------------------------------------
@pytest.fixture
def first_generation(monkeypatch):
    monkeypatch.setenv("HPU_NB_DEVICE", "gaudi")
    reset_backend()
    get_backend()  # the emulated card is now a GAUDI
    yield
    monkeypatch.delenv("HPU_NB_DEVICE")
    reset_backend()
    get_backend()  # back to the default Gaudi2 for the next tests


def test_first_generation_gaudi_refuses_fp8(first_generation) -> None:
    import habana_frameworks.torch.hpex.experimental.transformer_engine as te

    assert te.fp8.FP8GlobalStateManager.is_fp8_available() == (
        False, "fp8 is not supported on GAUDI: it needs Gaudi2 or newer.")
    layer = te.Linear(4, 4)  # building layers is allowed; running them in fp8 is not
    with pytest.raises(RuntimeError, match="fp8 is not supported on GAUDI"), te.fp8_autocast(enabled=True):
        pass
    assert not te.fp8.FP8GlobalStateManager.is_fp8_enabled()
    with te.fp8_autocast(enabled=False):
        assert layer(torch.ones(1, 4)).dtype == torch.float32


# -- HPUPrecisionPlugin("fp8") goes through the transformer engine, as on a Gaudi --------------------------------------
def test_precision_plugin_uses_the_transformer_engine(te) -> None:
    from hpu_nb import HPUPrecisionPlugin
    from hpu_nb.runtime.fp8.transformer_engine import TransformerEngineTraining
    from hpu_nb.runtime.habana_fp8 import HabanaFp8Engine

    engine = get_backend().fp8_engine()
    assert isinstance(engine, TransformerEngineTraining) and issubclass(HabanaFp8Engine, TransformerEngineTraining)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4, bias=False))
    params = list(model.parameters())
    plugin = HPUPrecisionPlugin("fp8")
    plugin.convert_modules(model, replace_layers=True, recipe=te.recipe.DelayedScaling(margin=2))
    assert isinstance(model[0], te.Linear) and isinstance(model[2], te.Linear) and model[2].bias is None
    assert all(a is b for a, b in zip(model.parameters(), params))  # the same Parameters
    with plugin.forward_context():
        state = te.fp8.FP8GlobalStateManager
        assert state.is_fp8_enabled() and state.get_fp8_recipe().margin == 2
        assert not torch.is_autocast_enabled("hpu")  # lightning-habana's fp8: fp8_autocast only, the rest fp32
        out = model(torch.randn(2, 8))
    assert out.dtype == torch.float32  # the fp8 layers return the activation dtype, as the plugin's tests assert
    model.to("hpu")
    with HPUPrecisionPlugin("fp8", bf16_autocast=True).forward_context():  # the opt-in: bf16 autocast around them
        assert te.fp8.FP8GlobalStateManager.is_fp8_enabled() and torch.is_autocast_enabled("hpu")
        assert model(torch.randn(2, 8, device="hpu")).dtype == torch.bfloat16


def test_the_seed_fp8_training_example_runs_as_written(te) -> None:
    from habana_frameworks.torch.hpex.experimental.transformer_engine import recipe
    from lightning import Trainer
    from lightning.pytorch.demos.boring_classes import BoringModel as LightningBoringModel

    from hpu_nb import HPUAccelerator, HPUPrecisionPlugin

    class BoringModel(LightningBoringModel):
        """The example's model: Lightning's, keeping its losses, with SGD at lr=0.01 (at Lightning's 0.1 it diverges in
        every precision, 32-true included: inputs of 32 unit normals)."""
        def __init__(self) -> None:
            super().__init__()
            self.losses: list[float] = []
            self.out_dtypes: set[torch.dtype] = set()
            self.devices: set[str] = set()

        def training_step(self, batch, batch_idx):
            out = self(batch)
            self.out_dtypes.add(out.dtype)
            self.devices.add(self.layer.weight.device.type)
            loss = self.loss(out)
            self.losses.append(loss.item())
            return {"loss": loss}

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    torch.manual_seed(0)
    model = BoringModel()

    # init the precision plugin for fp8 training.
    plugin = HPUPrecisionPlugin(precision="fp8")

    # Replace torch.nn.Modules with transformer engine equivalent modules
    plugin.convert_modules(model, replace_layers=True, recipe=recipe.DelayedScaling())

    # Initialize a trainer with HPUPrecisionPlugin
    trainer = Trainer(accelerator=HPUAccelerator(), plugins=plugin, **quiet_trainer_kwargs(max_epochs=2))

    # Train the model ⚡
    trainer.fit(model)

    assert isinstance(model.layer, te.Linear) and model.devices == {"hpu"}
    assert model.out_dtypes == {torch.float32}  # fp8_autocast only, as the plugin: the activation dtype
    assert len(model.losses) == 128 and int(model.layer.steps) == 127
    first, last = statistics.mean(model.losses[:16]), statistics.mean(model.losses[-16:])
    assert last < 0.5 * first, (first, last)

"""fp8 training: quantisation error bounds, the emulated fp8 linear (delayed scaling, grads), convergence vs bf16,
first-generation refusal, and the Gaudi path (te.Linear, fp8_autocast) against the fake habana_frameworks."""

from __future__ import annotations

import statistics

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from hpu_nb.core.fp8 import DelayedScaling, Format, convert_modules
from hpu_nb.core.precision import HPUPrecisionPlugin, UnsupportedPrecisionError
from hpu_nb.emulator.fp8.numerics import dequantize, fp8_max, matmul_path, quantize, relative_error, scale_from_amax
from hpu_nb.emulator.fp8.training import Fp8Linear, emulated_fp8_autocast
from tests.fake_habana.fixture import fake_gaudi, make_fake_gaudi  # noqa: F401
from tests.helpers.models import quiet_trainer_kwargs


def test_scaled_mm_is_the_matmul_where_torch_has_a_cpu_kernel_for_it() -> None:
    # torch's CPU _scaled_mm arrived after 2.7 (Gaudi 1.22's torch): there the emulation dequantizes and multiplies
    if torch._C._dispatch_has_kernel_for_dispatch_key("aten::_scaled_mm", "CPU"):
        assert matmul_path() == "torch._scaled_mm"
    else:
        assert matmul_path() == "dequantize + float32 matmul (torch._scaled_mm unavailable)"


@pytest.mark.parametrize("dtype, mantissa_bits", [(torch.float8_e4m3fn, 3), (torch.float8_e5m2, 2)])
def test_quantisation_error_is_within_half_an_ulp(dtype, mantissa_bits) -> None:
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 3
    scale = scale_from_amax(x.abs().max(), dtype)
    q = quantize(x, scale, dtype)
    assert q.dtype == dtype
    back = dequantize(q, scale)
    normal = (x * scale).abs() >= torch.finfo(dtype).smallest_normal
    bound = 2.0 ** -(mantissa_bits + 1)
    rel = ((back - x).abs() / x.abs())[normal]
    assert rel.max().item() <= bound + 1e-7
    assert rel.max().item() > bound / 4  # it really rounds
    assert back.abs().max().item() == pytest.approx(x.abs().max().item(), rel=bound)


def test_quantize_saturates_instead_of_nan() -> None:
    q = quantize(torch.tensor([1e6, -1e6]), torch.tensor(1.0), torch.float8_e4m3fn)
    assert q.float().tolist() == [fp8_max(torch.float8_e4m3fn), -fp8_max(torch.float8_e4m3fn)]


def test_fp8_linear_keeps_the_weights_and_is_plain_outside_fp8_autocast() -> None:
    linear = torch.nn.Linear(32, 16)
    before = linear.weight.detach().clone()
    layer = Fp8Linear(linear)
    assert layer.weight is linear.weight and torch.equal(layer.weight, before)
    x = torch.randn(4, 32)
    assert torch.equal(layer(x), linear(x))


def test_fp8_linear_forward_and_backward_close_to_fp32() -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 32)
    layer = Fp8Linear(torch.nn.Linear(64, 32), DelayedScaling())
    layer.load_state_dict(linear.state_dict(), strict=False)
    x = torch.randn(16, 64)
    with emulated_fp8_autocast():
        for _ in range(2):  # first step scales from the initial 1.0; the second uses the recorded amax history
            x1 = x.clone().requires_grad_()
            out = layer(x1)
            (out.float() ** 2).sum().backward()
    assert out.dtype == torch.float32  # the activation dtype
    x2 = x.clone().requires_grad_()
    ref = linear(x2)
    (ref**2).sum().backward()
    assert 1e-3 < relative_error(out, ref) < 0.06  # fp8 error: visible, bounded
    assert relative_error(x1.grad, x2.grad) < 0.15
    assert layer.steps.item() == 1 and layer.amax_history[0, 0] == pytest.approx(x.abs().max().item())


def test_delayed_scaling_uses_history_margin_and_formats() -> None:
    layer = Fp8Linear(torch.nn.Linear(8, 8), DelayedScaling(margin=1, amax_history_len=4))
    with emulated_fp8_autocast():
        for value in (2.0, 8.0, 4.0):
            layer(torch.full((2, 8), value, requires_grad=True)).float().sum().backward()
        layer(torch.ones(2, 8))  # folds the last step into the history
    e4m3, e5m2 = fp8_max(torch.float8_e4m3fn), fp8_max(torch.float8_e5m2)
    assert layer.amax_history[:3, 0].tolist() == [4.0, 8.0, 2.0]
    assert layer.scale[0].item() == pytest.approx(e4m3 / 8.0 / 2)  # max over the history, then the margin
    assert layer.scale[2].item() == pytest.approx(e5m2 / layer.amax_history[:, 2].max().item() / 2)  # grads: E5M2
    assert Format.HYBRID.forward_dtype == torch.float8_e4m3fn and Format.HYBRID.backward_dtype == torch.float8_e5m2
    with pytest.raises(ValueError, match="amax_compute_algo"):
        DelayedScaling(amax_compute_algo="mean")


class MLP(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                       torch.nn.ReLU(), torch.nn.Linear(64, 1))
        self.losses: list[float] = []
        self.out_dtypes: set[torch.dtype] = set()

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self.net(x)
        self.out_dtypes.add(out.dtype)
        loss = torch.nn.functional.mse_loss(out.float(), y.float())  # y arrives in bf16 under DeepSpeed
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=3e-3)


def train_data() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 32, generator=g)
    y = torch.sin(x @ torch.randn(32, 1, generator=g) / 4) + 0.1 * x[:, :1] ** 2
    return DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(1))


def _train(plugin: HPUPrecisionPlugin, fp8: bool) -> MLP:
    torch.manual_seed(0)
    model = MLP()
    if fp8:
        plugin.convert_modules(model, replace_layers=True, recipe=DelayedScaling())
    trainer = L.Trainer(accelerator="hpu", devices=1, plugins=[plugin], **quiet_trainer_kwargs(max_epochs=6))
    trainer.fit(model, train_data())
    return model


def test_fp8_training_converges_within_10_percent_of_bf16() -> None:
    bf16 = _train(HPUPrecisionPlugin("bf16-mixed"), fp8=False)
    fp8 = _train(HPUPrecisionPlugin("fp8"), fp8=True)
    assert all(isinstance(m, Fp8Linear) for m in (fp8.net[0], fp8.net[2], fp8.net[4]))
    assert fp8.out_dtypes == {torch.float32}  # fp8_autocast only: the fp8 layers return the activation dtype
    bf16_final, fp8_final = statistics.mean(bf16.losses[-16:]), statistics.mean(fp8.losses[-16:])
    assert fp8_final < 0.5 * statistics.mean(fp8.losses[:16])  # it learned
    print(f"final loss: bf16 {bf16_final:.4f}, fp8 {fp8_final:.4f} ({fp8_final / bf16_final - 1:+.1%})")
    assert abs(fp8_final - bf16_final) <= 0.10 * bf16_final, (fp8_final, bf16_final)


def test_first_generation_refuses_fp8_conversion(monkeypatch) -> None:
    monkeypatch.setenv("HPU_NB_DEVICE", "gaudi")
    with pytest.raises(UnsupportedPrecisionError, match="fp8.*Gaudi2 or newer"):
        convert_modules(torch.nn.Sequential(torch.nn.Linear(4, 4)), replace_layers=True)


def test_convert_modules_needs_fp8_precision() -> None:
    with pytest.raises(ValueError, match="precision='fp8'"):
        HPUPrecisionPlugin("bf16-mixed").convert_modules(torch.nn.Linear(4, 4), replace_layers=True)


@pytest.mark.parametrize(("release", "te_module"), [
    ("1.18.0", "habana_frameworks.torch.hpex.experimental.transformer_engine"),
    ("1.21.0", "intel_transformer_engine"),  # the shim: the classes are Intel's
])
def test_gaudi_path_uses_te_linear_with_copied_weights_and_fp8_autocast(make_fake_gaudi, release, te_module) -> None:  # noqa: F811
    fake = make_fake_gaudi(release=release)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4, bias=False))
    weights = [model[0].weight.detach().clone(), model[2].weight.detach().clone()]
    plugin = HPUPrecisionPlugin("fp8")
    plugin.convert_modules(model, replace_layers=True, recipe=DelayedScaling(margin=2, amax_history_len=8))
    assert type(model[0]).__module__ == te_module and type(model[2]).__module__ == te_module
    assert torch.equal(model[0].weight, weights[0]) and torch.equal(model[2].weight, weights[1])
    assert model[2].bias is None
    made = fake.calls.named("Linear.__init__")
    assert [c.kwargs.get("bias", c.args[3] if len(c.args) > 3 else True) for c in made] == [True, False]

    from habana_frameworks.torch.hpex.experimental.transformer_engine import recipe as te_recipe

    with plugin.forward_context():
        assert not torch.is_autocast_enabled("hpu")  # lightning-habana's fp8: the transformer engine's region only
        out = model(torch.randn(2, 8))
    (call,) = fake.calls.named("fp8_autocast")
    assert call.kwargs["enabled"] is True
    sent = call.kwargs["fp8_recipe"]
    assert isinstance(sent, te_recipe.DelayedScaling)
    assert (sent.margin, sent.amax_history_len, sent.fp8_format) == (2, 8, te_recipe.Format.HYBRID)
    assert out.dtype == torch.float32  # the activation dtype
    plugin.convert_modules(model, replace_layers=True)  # already te modules (found with isinstance): left alone
    assert fake.calls.count("Linear.__init__") == 2
    with HPUPrecisionPlugin("fp8", bf16_autocast=True).forward_context():  # opt-in: bf16 autocast around fp8
        assert torch.is_autocast_enabled("hpu") and torch.get_autocast_dtype("hpu") == torch.bfloat16
    assert fake.calls.count("fp8_autocast") == 2


def test_first_generation_gaudi_refuses_fp8(make_fake_gaudi) -> None:  # noqa: F811
    make_fake_gaudi(device_name="GAUDI", release="1.21.0")
    with pytest.raises(UnsupportedPrecisionError, match="GAUDI"):
        HPUPrecisionPlugin("fp8")


def test_precision_flag_fp8_gives_the_hpu_fp8_plugins() -> None:
    """Lightning refuses precision="fp8" by name; with an HPU accelerator hpu_nb's connector hook carries it through."""
    from lightning.fabric import Fabric

    from hpu_nb.core.fabric.precision import HPUPrecision

    for accelerator in ("hpu", __import__("hpu_nb").HPUAccelerator()):
        trainer = L.Trainer(accelerator=accelerator, devices=1, precision="fp8", logger=False)
        assert type(trainer.precision_plugin) is HPUPrecisionPlugin and trainer.precision_plugin.precision == "fp8"
    fabric = Fabric(accelerator="hpu", devices=1, precision="fp8")
    assert type(fabric._precision) is HPUPrecision and fabric._precision.precision == "fp8"
    with pytest.raises(ValueError, match="Received both `precision='fp8'`"):
        L.Trainer(accelerator="hpu", devices=1, precision="fp8", plugins=[HPUPrecisionPlugin("fp8")], logger=False)
    with pytest.raises(ValueError, match="Precision 'fp8' is invalid"):  # not an HPU: Lightning's own answer
        L.Trainer(accelerator="cpu", devices=1, precision="fp8", logger=False)

"""Precision the Lightning way: Fabric's HPUPrecision holds the work and the Trainer's HPUPrecisionPlugin is a thin
subclass; `convert_module` acts during set-up (replace_layers=True swaps layers in trainer.fit / fabric.setup); one
float-dtype map; "16-mixed" brings a loss scaler, measured against an underflow case on the emulated Gaudi2."""

from __future__ import annotations

import inspect

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.fabric import Fabric
from torch.utils.data import DataLoader, TensorDataset

from hpu_nb.core.fabric.precision import HPUFSDPPrecision as FabricFSDPPrecision
from hpu_nb.core.fabric.precision import HPUPrecision
from hpu_nb.core.fp8 import has_fp8_layers
from hpu_nb.core.fp8.plugin import HPUFp8Mixin
from hpu_nb.core.precision import HPUPrecisionPlugin
from hpu_nb.core.precision_names import PRECISION_DTYPES, autocast_dtype, precision_dtype
from hpu_nb.core.strategies.fsdp import HPUFSDPPrecision
from tests.helpers.models import quiet_trainer_kwargs


# -- one implementation: Fabric's class, the Trainer's a subclass adding the Trainer's hooks ---------------------------
def test_the_trainer_plugin_is_fabrics_precision_with_the_trainers_hooks():
    from lightning.fabric.plugins.precision import Precision as FabricPrecision
    from lightning.pytorch.plugins.precision import Precision as TrainerPrecision

    assert issubclass(HPUPrecisionPlugin, HPUPrecision) and issubclass(HPUPrecisionPlugin, TrainerPrecision)
    assert issubclass(HPUPrecision, FabricPrecision) and not issubclass(HPUPrecision, TrainerPrecision)
    for name in ("__init__", "forward_context", "autocast_context_manager", "convert_module", "convert_modules",
                 "state_dict", "load_state_dict", "teardown", "__repr__"):
        assert getattr(HPUPrecisionPlugin, name) is getattr(HPUPrecision, name), name
    own = {name for name in vars(HPUPrecisionPlugin) if not name.startswith("__")}
    assert own == {"pre_backward", "optimizer_step", "clip_gradients"}  # the Trainer's loop hooks, nothing else
    assert inspect.signature(HPUPrecisionPlugin).parameters.keys() == inspect.signature(HPUPrecision).parameters.keys()


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "16-mixed", "fp8"])
def test_fabric_and_trainer_plugins_run_the_same_forward(precision):
    for plugin in (HPUPrecision(precision), HPUPrecisionPlugin(precision)):
        assert plugin.precision == precision
        with plugin.forward_context():
            expected = autocast_dtype(precision)
            assert torch.is_autocast_enabled("hpu") == (expected is not None)
            if expected is not None:
                assert torch.get_autocast_dtype("hpu") == expected


def test_one_float_dtype_map_for_every_plugin():
    assert precision_dtype("bf16-mixed") == precision_dtype("bf16-true") == torch.bfloat16
    # fp8: the fp8 layers in fp8, the rest in float32 under no torch.autocast (lightning-habana's)
    assert precision_dtype("fp8") == torch.float32 and autocast_dtype("fp8") is None
    assert precision_dtype("16-mixed") == precision_dtype("16-true") == torch.float16
    assert precision_dtype("32-true") == torch.float32 and autocast_dtype("32-true") is None
    assert autocast_dtype("bf16-true") is None and autocast_dtype("16-mixed") == torch.float16
    for cls in (HPUFSDPPrecision, FabricFSDPPrecision):
        for precision in ("32-true", "bf16-mixed", "bf16-true", "16-mixed", "16-true"):
            config = cls(precision).mixed_precision_config
            lower = PRECISION_DTYPES[precision]
            assert config.reduce_dtype == config.buffer_dtype == lower
            assert config.param_dtype == (torch.float32 if precision.endswith("-mixed") else lower)
            with cls(precision).forward_context():
                assert torch.is_autocast_enabled("hpu") == precision.endswith("-mixed")
                if precision.endswith("-mixed"):
                    assert torch.get_autocast_dtype("hpu") == lower


# -- convert_module: replace_layers=True acts while the model is set up ------------------------------------------------
class MLP(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self(x).float(), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _data(n: int = 64) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 32, generator=g)
    return DataLoader(TensorDataset(x, x[:, :1].clone()), batch_size=16)


def _te():
    import habana_frameworks.torch.hpex.experimental.transformer_engine as te

    return te


def test_trainer_fit_with_replace_layers_ends_with_te_linear_layers():
    torch.manual_seed(0)
    model = MLP()
    before = [model.net[i].weight.detach().clone() for i in (0, 2)]
    trainer = L.Trainer(accelerator="hpu", devices=1, plugins=[HPUPrecisionPlugin("fp8", replace_layers=True)],
                        **quiet_trainer_kwargs(max_epochs=2))
    trainer.fit(model, _data())  # no convert_modules() call: the strategy's set-up converted the model
    te = _te()
    assert all(isinstance(model.net[i], te.Linear) for i in (0, 2))
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    # the optimizer was made after the swap: it trained the fp8 layers' weights (they started as the Linears')
    optimizer = trainer.optimizers[0]
    trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert {id(model.net[i].weight) for i in (0, 2)} <= trained
    assert all(not torch.equal(model.net[i].weight.detach().cpu(), w) for i, w in zip((0, 2), before))
    assert trainer.global_step == 8


def test_convert_module_leaves_other_precisions_and_converted_models_alone():
    model = MLP()
    assert HPUPrecisionPlugin("bf16-mixed").convert_module(model) is model and not has_fp8_layers(model)
    assert HPUPrecisionPlugin("fp8").convert_module(model) is model and not has_fp8_layers(model)  # no replace_layers
    plugin = HPUPrecisionPlugin("fp8", replace_layers=True)
    assert plugin.convert_modules(model) is model and has_fp8_layers(model)  # lightning-habana's explicit call
    layers = [model.net[0], model.net[2]]
    assert plugin.convert_module(model) is model and [model.net[0], model.net[2]] == layers  # not converted twice


def test_fabric_setup_with_replace_layers_converts_the_model():
    torch.manual_seed(0)
    fabric = Fabric(accelerator="hpu", devices=1, plugins=[HPUPrecision("fp8", replace_layers=True)])
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    model = fabric.setup(model)
    assert all(isinstance(model.module[i], _te().Linear) for i in (0, 2))
    out = model(torch.randn(8, 32, device=fabric.device))
    assert out.dtype == torch.float32  # fp8 layers output the activation dtype (no autocast: the plugin's fp8)


def test_deepspeed_plugin_converts_fp8_layers_and_keeps_deepspeeds_cast():
    pytest.importorskip("deepspeed")
    from hpu_nb.core.strategies.deepspeed import HPUDeepSpeedPrecisionPlugin

    assert HPUDeepSpeedPrecisionPlugin.convert_module is HPUFp8Mixin.convert_module
    model = MLP()
    assert HPUDeepSpeedPrecisionPlugin("fp8", replace_layers=True).convert_module(model) is model
    assert has_fp8_layers(model)
    cast = HPUDeepSpeedPrecisionPlugin("bf16-true").convert_module(MLP())  # Lightning's DeepSpeedPrecision casts
    assert {p.dtype for p in cast.parameters()} == {torch.bfloat16}


def test_every_hpu_strategy_converts_the_module_during_set_up():
    """Lightning's strategies call precision_plugin.convert_module in `setup`: the HPU strategies keep that call."""
    from hpu_nb.core.strategies.fsdp import HPUFSDPStrategy
    from hpu_nb.core.strategies.parallel import HPUDDPStrategy, HPUParallelStrategy
    from hpu_nb.core.strategies.single import SingleHPUStrategy

    classes = [SingleHPUStrategy, HPUParallelStrategy, HPUDDPStrategy, HPUFSDPStrategy]
    try:
        from hpu_nb.core.strategies.deepspeed import HPUDeepSpeedStrategy

        classes.append(HPUDeepSpeedStrategy)
    except ImportError:
        pass
    for cls in classes:
        owner = next(c for c in cls.__mro__ if "setup" in vars(c))
        if owner.__module__.startswith("hpu_nb"):  # ours: it must hand over to Lightning's setup
            assert "super().setup(trainer)" in inspect.getsource(owner.setup), cls
            owner = next(c for c in owner.__mro__[1:] if "setup" in vars(c))
        assert owner.__module__.startswith("lightning.pytorch.strategies"), (cls, owner)
        assert "precision_plugin.convert_module(self.model)" in inspect.getsource(owner.setup), (cls, owner)


# -- 16-mixed and the loss scaler -------------------------------------------------------------------------------------
def _grads_of_a_nearly_fitted_mlp(plugin, size: int = 64) -> tuple[dict, dict]:
    """One backward through a 2-layer MLP whose loss gradient is ~2 * 1e-4 / size**2 = 5e-8 per output, below what
    float16 holds (its smallest subnormal is 6e-8); returns the unscaled gradients and the float32 reference's."""
    torch.manual_seed(0)

    def net():
        return torch.nn.Sequential(torch.nn.Linear(size, size), torch.nn.Tanh(), torch.nn.Linear(size, size))

    model, ref = net(), net()
    ref.load_state_dict(model.state_dict())
    x, delta = torch.randn(size, size), 1e-4 * torch.randn(size, size)
    model = model.to("hpu")
    with plugin.forward_context():
        with torch.no_grad():
            target = model(x.to("hpu")).float() + delta.to("hpu")  # the fp16 model's own output, nudged by delta
        loss = F.mse_loss(model(x.to("hpu")), target)
    assert loss.dtype == torch.float32  # mse_loss is on Habana's fp32 list
    scaler = plugin.scaler
    (scaler.scale(loss) if scaler is not None else loss).backward()
    if scaler is not None:
        scaler.unscale_(torch.optim.SGD(model.parameters(), lr=0.1))
    F.mse_loss(ref(x), ref(x).detach() + delta).backward()
    grads = {name: p.grad.cpu() for name, p in model.named_parameters()}
    return grads, {name: p.grad for name, p in ref.named_parameters()}


def _relative_error(grads: dict, ref: dict) -> dict:
    return {name: ((grads[name] - ref[name]).norm() / ref[name].norm()).item() for name in grads}


def test_16_mixed_without_a_scaler_loses_small_gradients_to_fp16_underflow():
    """The evidence for the scaler: the same step with the scaler turned off."""
    grads, ref = _grads_of_a_nearly_fitted_mlp(HPUPrecisionPlugin("16-mixed", scaler=torch.amp.GradScaler(
        "hpu", enabled=False)))
    error = _relative_error(grads, ref)
    zeros = {name: (g == 0).float().mean().item() for name, g in grads.items()}
    print("no scaler: relative error", error, "zero fraction", zeros)
    assert error["0.weight"] > 0.5 and error["0.bias"] > 0.5  # the first layer's gradients are mostly lost
    assert zeros["0.weight"] > 0.03 and zeros["2.weight"] > 0.03  # and some are exactly zero
    assert all(not (r == 0).any() for r in ref.values())


@pytest.mark.parametrize("plugin_class", [HPUPrecisionPlugin, HPUPrecision])
def test_16_mixed_brings_a_grad_scaler_and_the_gradients_survive(plugin_class):
    plugin = plugin_class("16-mixed")
    assert isinstance(plugin.scaler, torch.amp.GradScaler) and plugin.scaler.is_enabled()
    assert plugin.scaler.get_scale() == 2.0**16
    grads, ref = _grads_of_a_nearly_fitted_mlp(plugin)
    error = _relative_error(grads, ref)
    print("GradScaler: relative error", error)
    assert max(error.values()) < 5e-3
    assert all(not (g == 0).any() for g in grads.values())


def test_only_16_mixed_has_a_scaler():
    for precision in ("32-true", "bf16-mixed", "fp8"):
        assert HPUPrecisionPlugin(precision).scaler is None and HPUPrecision(precision).scaler is None
        assert HPUPrecisionPlugin(precision).state_dict() == {}
    with pytest.raises(ValueError, match="does not use a scaler"):
        HPUPrecisionPlugin("bf16-mixed", scaler=torch.amp.GradScaler("hpu"))
    with pytest.raises(ValueError, match="does not use a scaler"):
        HPUFSDPPrecision("bf16-mixed", scaler=torch.amp.GradScaler("hpu"))
    mine = torch.amp.GradScaler("hpu", init_scale=1024.0)
    assert HPUPrecisionPlugin("16-mixed", scaler=mine).scaler is mine


def test_fsdp_16_mixed_has_a_sharded_scaler_on_hpu():
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    for cls in (HPUFSDPPrecision, FabricFSDPPrecision):
        scaler = cls("16-mixed").scaler
        assert isinstance(scaler, ShardedGradScaler) and scaler.is_enabled()  # Lightning's default is CUDA's: off here
        assert scaler._device == "hpu"
        assert cls("bf16-mixed").scaler is None and cls("16-true").scaler is None


class TinySteps(L.LightningModule):
    """A linear model whose loss gradient is tiny (fp16 would flush it), and whose chosen steps blow up to inf."""

    def __init__(self, inf_at: tuple[int, ...] = ()) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(16, 16)
        self.inf_at = inf_at
        self.grads: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        x, target = batch
        loss = F.mse_loss(self.layer(x), target)
        if batch_idx in self.inf_at:
            loss = loss * float("inf")
        return loss

    def on_before_optimizer_step(self, optimizer):
        self.grads.append(self.layer.weight.grad.detach().cpu().clone())  # unscaled by now, as Lightning's AMP does

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1.0)


def _tiny_gradient_data(model: TinySteps, steps: int) -> tuple[DataLoader, torch.Tensor]:
    """Targets the model's own float16 output nudged by ~1e-4: the loss gradient per output is ~1e-6 (16x16 outputs),
    the weight gradients ~1e-6, where float16 keeps 2-4 bits. Returns the data and the nudges."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16 * steps, 16, generator=g)
    delta = 1e-4 * torch.randn(16 * steps, 16, generator=g)
    layer = torch.nn.Linear(16, 16).to("hpu")
    layer.load_state_dict(model.layer.state_dict())
    with torch.no_grad(), torch.autocast("hpu", dtype=torch.float16):
        target = layer(x.to("hpu")).float().cpu() + delta
    return DataLoader(TensorDataset(x, target), batch_size=16), delta


def test_trainer_16_mixed_scales_the_loss_and_skips_the_step_on_inf():
    model = TinySteps(inf_at=(0,))
    data, delta = _tiny_gradient_data(model, steps=2)
    start_weight, start_bias = model.layer.weight.detach().clone(), model.layer.bias.detach().clone()
    plugin = HPUPrecisionPlugin("16-mixed")
    trainer = L.Trainer(accelerator="hpu", devices=1, plugins=[plugin], **quiet_trainer_kwargs(max_steps=2))
    trainer.fit(model, data)
    # step 0: inf gradients -> the optimizer step is skipped, the scale halves; step 1 runs with 2**15
    assert not torch.isfinite(model.grads[0]).all()
    assert plugin.scaler.get_scale() == 2.0**15
    # step 1's gradient (unscaled) matches float32's at the weights step 0 left unchanged (the same nudge)
    reference = torch.nn.Linear(16, 16)
    reference.load_state_dict({"weight": start_weight, "bias": start_bias})
    x = data.dataset.tensors[0][16:]
    F.mse_loss(reference(x), reference(x).detach() + delta[16:]).backward()
    ref_grad = reference.weight.grad
    assert torch.isfinite(model.grads[1]).all() and (model.grads[1] != 0).all()
    assert ((model.grads[1] - ref_grad).norm() / ref_grad.norm()).item() < 0.05
    moved = model.layer.weight.detach().cpu() - start_weight
    assert torch.allclose(moved, -model.grads[1], atol=1e-6)  # only step 1 moved the weights (lr=1)
    assert trainer.global_step == 2
    assert plugin.state_dict()["scale"] == 2.0**15  # saved in checkpoints under the plugin's name


def test_fabric_16_mixed_scales_and_skips_the_step_on_inf():
    fabric = Fabric(accelerator="hpu", devices=1, precision="16-mixed")
    plugin = fabric.strategy.precision
    assert isinstance(plugin, HPUPrecision) and plugin.scaler is not None
    model = TinySteps()
    data, _ = _tiny_gradient_data(model, steps=1)
    x, target = (t.to(fabric.device) for t in data.dataset.tensors)
    layer, optimizer = fabric.setup(model.layer, torch.optim.SGD(model.layer.parameters(), lr=1.0))
    start = layer.weight.detach().cpu().clone()
    # the loss in float32, as Lightning's own AMP examples do: torch 2.9's CPU mse_loss backward refuses a float16
    # input with a float32 target ("Found dtype Float but expected Half"), on the plain CPU too
    fabric.backward(F.mse_loss(layer(x).float(), target) * float("inf"))
    optimizer.step()
    optimizer.zero_grad()
    assert torch.equal(layer.weight.detach().cpu(), start) and plugin.scaler.get_scale() == 2.0**15
    loss = F.mse_loss(layer(x).float(), target)
    fabric.backward(loss)
    assert layer.weight.grad.abs().max().item() > 1e-3  # scaled by 2**15: well inside float16
    fabric.clip_gradients(layer, optimizer, max_norm=1e9)  # unscales, as Fabric's AMP does
    unscaled = layer.weight.grad.detach().cpu().clone()
    assert unscaled.abs().max().item() < 1e-3 and (unscaled != 0).all()
    optimizer.step()
    assert torch.allclose(layer.weight.detach().cpu(), start - unscaled, atol=1e-7)


# -- the scaler uses only ops a Gaudi has kernels for (tests/emulator/test_hpu_grad_scaler.py checks its numbers) ------
def test_16_mixed_scalers_are_hpu_grad_scalers_and_torchs_is_taken_with_a_warning():
    import warnings

    import hpu_nb
    from hpu_nb.core.mixed_precision import HPUGradScaler, HPUShardedGradScaler

    assert hpu_nb.HPUGradScaler is HPUGradScaler
    for cls in (HPUPrecisionPlugin, HPUPrecision):
        assert type(cls("16-mixed").scaler) is HPUGradScaler
    for cls in (HPUFSDPPrecision, FabricFSDPPrecision):
        assert type(cls("16-mixed").scaler) is HPUShardedGradScaler
    mine = HPUGradScaler(init_scale=1024.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an HPUGradScaler, or torch's turned off, is taken silently
        assert HPUPrecisionPlugin("16-mixed", scaler=mine).scaler is mine
        HPUPrecision("16-mixed", scaler=torch.amp.GradScaler("hpu", enabled=False))
    torchs = torch.amp.GradScaler("hpu")
    with pytest.warns(UserWarning, match="no HPU kernel for.*Use hpu_nb.HPUGradScaler") as record:
        plugin = HPUPrecisionPlugin("16-mixed", scaler=torchs)
    assert plugin.scaler is torchs and record[0].filename == __file__  # points at the caller
    layer = torch.nn.Linear(2, 2).to("hpu")
    plugin.scaler.scale(layer(torch.ones(1, 2, device="hpu")).sum()).backward()
    with pytest.raises(NotImplementedError, match="'HPU' backend"):  # as on a Gaudi
        plugin.scaler.unscale_(torch.optim.SGD(layer.parameters(), lr=0.1))

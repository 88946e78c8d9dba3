"""Lightning Fabric on HPU: `Fabric(accelerator="hpu", devices=N, strategy=..., precision=...)`.

Rewritten from the behaviours lightning-habana's Fabric tests assert (accelerator, strategy defaults, mixed precision,
FSDP wrapping / mixed-precision dtypes / sharding), plus real training on 1 and 2 emulated cards, on the fake Gaudi,
with the standalone `lightning_fabric` package, and from a notebook kernel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning.fabric import Fabric
from lightning.fabric.accelerators import ACCELERATOR_REGISTRY
from lightning.fabric.strategies import STRATEGY_REGISTRY

import hpu_nb
from hpu_nb.fabric import (
    HPUAccelerator,
    HPUCheckpointIO,
    HPUDDPStrategy,
    HPUFSDPPrecision,
    HPUFSDPStrategy,
    HPUParallelStrategy,
    HPUPrecision,
    SingleHPUStrategy,
)
from hpu_nb.runtime import get_backend

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "dist_scripts" / "fabric_fit.py"
CLEAN_ENV = ("HPU_NB_BACKEND", "PT_HPU_LAZY_MODE", "HABANA_VISIBLE_MODULES", "HLS_MODULE_ID", "WORLD_SIZE", "RANK",
             "LOCAL_RANK", "MASTER_PORT", "LT_CLI_USED")


def run_script(out: Path, *args: str, env: dict | None = None, timeout: float = 150) -> list[dict]:
    full_env = {k: v for k, v in os.environ.items() if k not in CLEAN_ENV}
    full_env["PYTHONPATH"] = str(ROOT)
    full_env.update(env or {})
    result = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), *args], capture_output=True, text=True,
                            timeout=timeout, env=full_env, cwd=str(out.parent), check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


# -- names and defaults (the plugin's test_accelerator / test_strategy) ---------------------------------------------
def test_fabric_registries_know_the_names_users_know():
    assert ACCELERATOR_REGISTRY["hpu"]["accelerator"] is HPUAccelerator
    for name, cls in (("single_hpu", SingleHPUStrategy), ("hpu_single", SingleHPUStrategy),
                      ("hpu_parallel", HPUParallelStrategy), ("hpu_ddp", HPUDDPStrategy),
                      ("hpu_fsdp", HPUFSDPStrategy)):
        assert STRATEGY_REGISTRY[name]["strategy"] is cls, name
    assert hpu_nb.HPUAccelerator is HPUAccelerator and hpu_nb.HPUCheckpointIO is HPUCheckpointIO  # one class each
    assert hpu_nb.HPUPrecision is HPUPrecision


def test_accelerator_behaves_as_the_plugin_s():
    assert HPUAccelerator.auto_device_count() >= 1 and HPUAccelerator.is_available()
    with pytest.raises(ValueError, match="Device should be HPU"):
        HPUAccelerator().setup_device(torch.device("cpu"))
    assert HPUAccelerator.get_parallel_devices(2) == [torch.device("hpu", 0)] * 2  # each process's own card


def test_strategy_defaults():
    assert SingleHPUStrategy().root_device == torch.device("hpu", 0)
    ddp = HPUDDPStrategy(parallel_devices=[torch.device("hpu")] * 2)
    assert ddp.process_group_backend == "hccl" and ddp.root_device == torch.device("hpu", 0)
    assert isinstance(ddp.checkpoint_io, HPUCheckpointIO)
    assert HPUFSDPStrategy().process_group_backend == "hccl"


@pytest.mark.parametrize("devices, strategy", [(1, SingleHPUStrategy), (2, HPUParallelStrategy)])
def test_fabric_with_accelerator_hpu_picks_hpu_pieces(devices, strategy):
    fabric = Fabric(accelerator="hpu", devices=devices, precision="bf16-mixed")
    assert type(fabric.strategy) is strategy and isinstance(fabric.accelerator, HPUAccelerator)
    assert isinstance(fabric.strategy.precision, HPUPrecision) and fabric.strategy.precision.precision == "bf16-mixed"
    assert fabric.device == torch.device("hpu", 0)


def test_fabric_fsdp_by_name_gets_hpu_fsdp_precision():
    fabric = Fabric(accelerator="hpu", devices=2, strategy="hpu_fsdp", precision="bf16-mixed")
    assert type(fabric.strategy) is HPUFSDPStrategy
    assert isinstance(fabric.strategy.precision, HPUFSDPPrecision)


def test_fsdp_precision_dtypes_as_the_plugin_had_them():
    """bf16-mixed / 16-mixed keep float32 parameters and reduce in the lower dtype; -true casts everything."""
    expected = {
        "bf16-mixed": (torch.float32, torch.bfloat16), "16-mixed": (torch.float32, torch.float16),
        "bf16-true": (torch.bfloat16, torch.bfloat16), "32-true": (torch.float32, torch.float32),
    }
    from hpu_nb import HPUFSDPPrecision as TrainerFSDPPrecision

    for precision, (param, lower) in expected.items():
        for plugin in (HPUFSDPPrecision(precision), TrainerFSDPPrecision(precision)):
            config = plugin.mixed_precision_config
            assert (config.param_dtype, config.reduce_dtype, config.buffer_dtype) == (param, lower, lower), precision


def test_fsdp_strategy_takes_the_trainer_s_precision_plugin_too():
    from hpu_nb import HPUFSDPPrecision as TrainerFSDPPrecision

    strategy = HPUFSDPStrategy(precision=TrainerFSDPPrecision("bf16-mixed"))
    assert isinstance(strategy.precision, HPUFSDPPrecision) and strategy.precision.precision == "bf16-mixed"
    with pytest.raises(TypeError, match="HPUFSDPPrecision"):
        strategy.precision = object()


# -- training on one card, in this process ---------------------------------------------------------------------------
class Recorder(torch.nn.Module):
    """Linear(32, 2) that records the dtypes it sees inside the forward (the plugin's MixedPrecisionModule)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(32, 2)
        self.seen: list[tuple[torch.dtype, torch.dtype]] = []

    def forward(self, x):
        out = self.layer(x)
        self.seen.append((x.dtype, out.dtype))
        return out


def _train(fabric: Fabric, steps: int = 20) -> tuple[Recorder, list[float]]:
    torch.manual_seed(0)
    model = Recorder()
    model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x = torch.randn(64, 32)
    target = x[:, :2] * 0.5
    loader = fabric.setup_dataloaders(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, target),
                                                                  batch_size=16))
    losses = []
    for _ in range(steps // len(loader)):
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(model(xb).float(), yb)
            optimizer.zero_grad()
            fabric.backward(loss)
            assert model.layer.weight.grad.dtype == torch.float32
            optimizer.step()
            losses.append(loss.item())
    return model.module, losses


@pytest.mark.parametrize("precision, inner", [("bf16-mixed", torch.bfloat16), ("32-true", torch.float32)])
def test_fabric_trains_on_one_hpu_with_mixed_precision(precision, inner):
    fabric = Fabric(accelerator="hpu", devices=1, strategy=SingleHPUStrategy(), precision=precision)
    model, losses = _train(fabric)
    assert model.layer.weight.device == torch.device("hpu", 0) and model.layer.weight.dtype == torch.float32
    assert {seen for seen in model.seen} == {(torch.float32, inner)}  # autocast on "hpu" inside the forward
    assert losses[-1] < losses[0] / 5
    assert get_backend().memory_stats()["MaxInUse"] > 0


def test_fabric_marks_steps_in_lazy_mode(monkeypatch):
    import habana_frameworks.torch.core as htcore

    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    before = htcore.placed_mark_steps
    _train(Fabric(accelerator="hpu", devices=1), steps=8)
    assert htcore.placed_mark_steps - before == 8 * 2  # after each backward and each optimizer step


@pytest.mark.parametrize(("release", "mark_steps"), [("1.18.0", 4 * 2), ("1.22.0", 0)])
def test_fabric_on_the_fake_gaudi_asks_habana(make_fake_gaudi, release, mark_steps):
    """Lazy mode (1.18's default): mark_step after backward and after the step; eager (1.21+): none."""
    fake = make_fake_gaudi(release=release)
    fabric = Fabric(accelerator="hpu", devices=1)
    fake.calls.clear()
    model, losses = _train(fabric, steps=4)
    assert model.layer.weight.device == torch.device("hpu", 0) and len(losses) == 4
    assert fake.calls.count("core.mark_step") == mark_steps


def test_fabric_checkpoint_round_trip(tmp_path):
    fabric = Fabric(accelerator="hpu", devices=1)
    model, _ = _train(fabric, steps=4)
    fabric.save(tmp_path / "state.ckpt", {"model": model, "step": 4})
    raw = torch.load(tmp_path / "state.ckpt", weights_only=False)
    assert raw["model"]["layer.weight"].device.type == "cpu"  # HPUCheckpointIO writes host tensors
    fresh = Recorder()
    state = {"model": fresh, "step": 0}
    fabric.load(tmp_path / "state.ckpt", state)
    assert state["step"] == 4 and torch.equal(fresh.layer.weight.cpu(), model.layer.weight.cpu())


# -- several cards, from a script -------------------------------------------------------------------------------------
@pytest.mark.timeout(200)
def test_fabric_ddp_on_two_cards_from_a_script(tmp_path):
    reports = run_script(tmp_path / "ddp", "--devices", "2", "--precision", "bf16-mixed")
    assert [r["rank"] for r in reports] == [0, 1] and len({r["pid"] for r in reports}) == 2
    assert {r["strategy"] for r in reports} == {"HPUParallelStrategy"}
    assert {r["process_group_backend"] for r in reports} == {"hccl"}
    assert [r["batch_devices"] for r in reports] == [["hpu:0"], ["hpu:0"]]
    assert [r["samples_seen"] for r in reports] == [32, 32]  # the distributed sampler splits the data
    assert reports[0]["losses"] != reports[1]["losses"]  # ... so each rank saw other batches
    assert {r["rank_sum"] for r in reports} == {3.0}
    assert reports[0]["mean_loss"] == pytest.approx((reports[0]["losses"][-1] + reports[1]["losses"][-1]) / 2)
    assert reports[0]["params"] == reports[1]["params"]  # gradients were all-reduced: the replicas agree
    assert reports[0]["output_dtypes"] == ["torch.bfloat16"]


@pytest.mark.timeout(200)
def test_fabric_fsdp_on_two_cards_from_a_script(tmp_path):
    # with a sharded checkpoint saved and loaded under lightning-habana's pytest settings (FutureWarnings are errors:
    # torch 2.13 deprecates the state-dict APIs Lightning's FSDP checkpointing calls, which the strategy keeps quiet)
    reports = run_script(tmp_path / "fsdp", "--devices", "2", "--strategy", "hpu_fsdp", "--precision", "bf16-mixed",
                         "--ckpt", str(tmp_path / "fsdp.ckpt"), env={"PYTHONWARNINGS": "error::FutureWarning"})
    assert [r["loaded_step"] for r in reports] == [4, 4] and len(list((tmp_path / "fsdp.ckpt").glob("*.distcp"))) == 2
    assert {r["strategy"] for r in reports} == {"HPUFSDPStrategy"} and {r["precision"] for r in reports} == {
        "HPUFSDPPrecision"}
    total = 16 * 32 + 32 + 32 + 1
    for report in reports:
        fsdp = report["fsdp"]
        assert fsdp["wrapped"] == 4  # the root and each of its three children (always_wrap_policy)
        assert (fsdp["param_dtype"], fsdp["reduce_dtype"], fsdp["buffer_dtype"]) == (
            "torch.float32", "torch.bfloat16", "torch.bfloat16")
        assert fsdp["param_device"] == "hpu:0"
    assert sum(r["fsdp"]["local_numel"] for r in reports) == total  # each card holds its shard only
    assert {r["rank_sum"] for r in reports} == {3.0}


@pytest.mark.timeout(200)
def test_standalone_lightning_fabric_on_two_cards(tmp_path):
    reports = run_script(tmp_path / "sa", "--devices", "2", "--package", "standalone")
    assert {r["strategy_module"] for r in reports} == {"hpu_nb._standalone.core.fabric.strategies"}
    assert reports[0]["params"] == reports[1]["params"] and {r["rank_sum"] for r in reports} == {3.0}


@pytest.mark.timeout(200)
def test_fabric_ddp_on_two_cards_of_the_fake_gaudi(make_fake_gaudi, tmp_path):
    fake = make_fake_gaudi(device_count=2, release="1.18.0")
    env = fake.subprocess_env()
    reports = run_script(tmp_path / "fake", "--devices", "2", "--steps", "4", env={
        "PYTHONPATH": env["PYTHONPATH"], "HPU_NB_FAKE_HABANA_CONFIG": env["HPU_NB_FAKE_HABANA_CONFIG"],
        "HPU_NB_BACKEND": "gaudi"})
    for report in reports:
        # once when Habana's HCCL module is imported, once by the strategy with the rank before its process group
        assert report["habana_calls"]["initialize_distributed_hpu"] == 2
        assert report["habana_calls"]["mark_step"] == 4 * 2  # lazy mode: after backward and after the step
    assert reports[0]["params"] == reports[1]["params"]


# -- from a notebook kernel: Fabric forks ------------------------------------------------------------------------------
NOTEBOOK_CELL = """
import json, torch, lightning as L

def run(fabric):
    fabric.seed_everything(3)
    model = torch.nn.Linear(8, 1)
    model, opt = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x = torch.randn(16, 8, device=fabric.device) + fabric.global_rank
    loss = model(x).pow(2).mean()
    fabric.backward(loss)
    opt.step()
    total = fabric.all_reduce(torch.tensor(float(fabric.global_rank + 1)), reduce_op="sum")
    return {"rank_sum": float(total), "weight": model.weight.detach().cpu().flatten().tolist(),
            "world": fabric.world_size}

fabric = L.Fabric(accelerator="hpu", devices=2)
result = fabric.launch(run)
print(json.dumps({"launcher": type(fabric.strategy.launcher).__name__, **result}))
"""


@pytest.mark.timeout(200)
def test_fabric_on_two_cards_from_a_notebook_cell():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(NOTEBOOK_CELL)])
    nbclient.NotebookClient(nb, timeout=150, kernel_name="python3").execute()
    text = "".join(o.get("text", "") for o in nb.cells[0].outputs if o.get("name") == "stdout")
    result = json.loads(text.strip().splitlines()[-1])
    assert result["launcher"] == "_FabricMultiProcessingLauncher"  # forked, as Lightning requires in Jupyter
    assert result["rank_sum"] == 3.0 and result["world"] == 2 and len(result["weight"]) == 8

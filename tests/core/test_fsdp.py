"""HPUFSDPStrategy: eager-mode rule, registration apart from Lightning's CUDA-only FSDP names, 2-process fits with
full and sharded checkpoints that load into a single-device run."""

from __future__ import annotations

import subprocess
import sys

import lightning as L
import pytest
import torch
from lightning.pytorch.strategies import FSDPStrategy, StrategyRegistry
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from hpu_nb.core.accelerator import HPUAccelerator
from hpu_nb.core.strategies.fsdp import HPUFSDPPrecision, HPUFSDPStrategy
from tests.core.test_parallel import rank_reports, run_fit
from tests.fake_habana import install_fake_habana

EAGER = {"PT_HPU_LAZY_MODE": "0"}
# lightning-habana's pytest settings: torch 2.13 deprecates FSDP.state_dict_type, which every FSDP checkpoint goes
# through (Lightning's and hpu_nb's helpers); the strategy keeps that warning out, so these runs still checkpoint
STRICT = {**EAGER, "PYTHONWARNINGS": "error::FutureWarning"}


def test_lazy_mode_is_refused_with_the_fix(monkeypatch):
    HPUFSDPStrategy()  # the emulated Gaudi runs eager by default, as today's Gaudi software does
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    with pytest.raises(MisconfigurationException, match="eager mode only.*PT_HPU_LAZY_MODE=0"):
        HPUFSDPStrategy()
    monkeypatch.delenv("PT_HPU_LAZY_MODE")
    with install_fake_habana(device_count=8, release="1.18.0"), pytest.raises(MisconfigurationException,
                                                                               match="this Gaudi is in lazy"):
        HPUFSDPStrategy()  # a Gaudi in its default lazy mode (up to 1.20)


def test_hpu_fsdp_is_registered_apart_from_lightnings_cuda_only_names(monkeypatch):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    assert StrategyRegistry["hpu_fsdp"]["strategy"] is HPUFSDPStrategy
    assert "hpu_fsdp" not in FSDPStrategy.get_registered_strategies()
    trainer = L.Trainer(accelerator="hpu", devices=2, strategy="hpu_fsdp", precision="bf16-mixed", logger=False)
    assert isinstance(trainer.accelerator, HPUAccelerator) and type(trainer.strategy) is HPUFSDPStrategy
    assert isinstance(trainer.precision_plugin, HPUFSDPPrecision)
    with trainer.precision_plugin.forward_context():
        assert torch.get_autocast_dtype("hpu") == torch.bfloat16 and torch.is_autocast_enabled("hpu")


def test_fp16_needs_gaudi2(monkeypatch):
    from hpu_nb.runtime import reset_backend

    monkeypatch.setenv("HPU_NB_DEVICE", "gaudi")
    reset_backend()
    with pytest.raises(ValueError, match="fp16 is not supported on"):
        HPUFSDPPrecision("16-mixed")


@pytest.mark.timeout(200)
def test_two_process_fsdp_full_state_dict_resumes_on_one_device(tmp_path):
    ckpt = tmp_path / "fsdp_full.ckpt"
    result = run_fit(tmp_path / "out", "--devices", "2", "--strategy", "fsdp:full", "--ckpt", str(ckpt), env=STRICT)
    assert result.returncode == 0, result.stderr[-3000:]
    reports = rank_reports(tmp_path / "out")
    assert [r["strategy"] for r in reports] == ["HPUFSDPStrategy"] * 2
    assert [r["samples_seen"] for r in reports] == [32, 32] and reports[0]["metrics"]["rank_sum"] == 3.0
    assert ckpt.is_file()
    # the full checkpoint holds every parameter unsharded: it resumes on one card with SingleHPUStrategy
    single = run_fit(tmp_path / "single", "--devices", "1", "--resume", str(ckpt), "--epochs", "2")
    assert single.returncode == 0, single.stderr[-3000:]
    (resumed,) = rank_reports(tmp_path / "single")
    assert resumed["strategy"] == "SingleHPUStrategy" and resumed["global_step"] == 4 + 8


@pytest.mark.timeout(200)
def test_two_process_fsdp_sharded_checkpoint_consolidates_for_one_device(tmp_path):
    ckpt = tmp_path / "fsdp_sharded.ckpt"
    result = run_fit(tmp_path / "out", "--devices", "2", "--strategy", "fsdp:sharded", "--ckpt", str(ckpt), env=STRICT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert ckpt.is_dir() and len(list(ckpt.glob("*.distcp"))) == 2  # one shard per rank

    # Lightning's own tool turns the shards into one file (what a user runs after training)
    output = tmp_path / "consolidated.ckpt"
    tool = subprocess.run(
        [sys.executable, "-m", "lightning.pytorch.utilities.consolidate_checkpoint", str(ckpt), "--output_file",
         str(output)], capture_output=True, text=True, timeout=120, check=False,
    )
    assert tool.returncode == 0, tool.stderr[-2000:]
    checkpoint = torch.load(output, weights_only=False)
    from tests.dist_scripts.fit import Model

    L.seed_everything(7, verbose=False)
    initial = Model().state_dict()  # the script's model before training (same seed)
    assert {k: v.shape for k, v in checkpoint["state_dict"].items()} == {k: v.shape for k, v in initial.items()}
    assert any(not torch.equal(checkpoint["state_dict"][k], initial[k]) for k in initial)  # trained, whole tensors

    # the consolidated weights load into a single-card run (its optimizer state stays in FSDP's by-name format,
    # which a plain optimizer cannot resume from: training continues with a fresh optimizer)
    from tests.dist_scripts.fit import data

    model = Model.load_from_checkpoint(output, map_location="cpu")
    for name, value in model.state_dict().items():
        assert torch.equal(value, checkpoint["state_dict"][name])
    trainer = L.Trainer(accelerator="hpu", devices=1, max_epochs=1, logger=False, enable_progress_bar=False,
                        enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(model, data())
    assert trainer.global_step == 8 and torch.isfinite(trainer.callback_metrics["train_loss"])

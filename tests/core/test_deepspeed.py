"""HPUDeepSpeedStrategy: registration, clear errors for bad configurations, ZeRO 1/2/3 fits in 1 and 2 processes.

Fits run as subprocesses (tests/dist_scripts/fit.py): DeepSpeed initialises torch.distributed, which must not leak
into the test process. The first DeepSpeed run on a machine compiles a small C++ op (cached afterwards).
"""

from __future__ import annotations

import json
import sys

import lightning as L
import pytest
import torch
from lightning.pytorch.strategies import StrategyRegistry
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from hpu_nb.runtime import reset_backend
from tests.core.test_parallel import rank_reports, run_fit

pytest.importorskip("deepspeed")

from hpu_nb.core.strategies.deepspeed import HPUDeepSpeedPrecisionPlugin, HPUDeepSpeedStrategy

FIT_TIMEOUT = 240  # includes the one-off compile of DeepSpeed's CPU communication op


# -- registration and selection --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "stage", "offload_optimizer", "offload_param"),
    [
        ("hpu_deepspeed", 2, False, False),
        ("hpu_deepspeed_stage_1", 1, False, False),
        ("hpu_deepspeed_stage_2", 2, False, False),
        ("hpu_deepspeed_stage_2_offload", 2, True, False),
        ("hpu_deepspeed_stage_3", 3, False, False),
        ("hpu_deepspeed_stage_3_offload", 3, True, True),
    ],
)
def test_registered_names_configure_zero(name, stage, offload_optimizer, offload_param):
    trainer = L.Trainer(accelerator="hpu", devices=2, strategy=name, logger=False)
    strategy = trainer.strategy
    assert type(strategy) is HPUDeepSpeedStrategy and StrategyRegistry[name]["strategy"] is HPUDeepSpeedStrategy
    zero = strategy.config["zero_optimization"]
    assert zero["stage"] == stage
    assert ("offload_optimizer" in zero) == offload_optimizer and ("offload_param" in zero) == offload_param
    assert strategy.parallel_devices == [torch.device("hpu", 0)] * 2


def test_precision_flag_gives_the_hpu_deepspeed_plugin():
    trainer = L.Trainer(accelerator="hpu", devices=1, strategy="hpu_deepspeed", precision="bf16-mixed", logger=False)
    assert isinstance(trainer.precision_plugin, HPUDeepSpeedPrecisionPlugin)
    assert trainer.precision_plugin.precision == "bf16-mixed"


def test_fp8_and_fp16_on_first_gaudi_are_refused(monkeypatch):
    assert HPUDeepSpeedPrecisionPlugin("fp8").precision == "fp8"  # Gaudi2 (tests/core/test_deepspeed_fp8.py runs it)
    with pytest.raises(ValueError, match="not supported with DeepSpeed"):
        HPUDeepSpeedPrecisionPlugin("16-true")
    monkeypatch.setenv("HPU_NB_DEVICE", "gaudi")
    reset_backend()
    with pytest.raises(ValueError, match="fp16 is not supported on"):
        HPUDeepSpeedPrecisionPlugin("16-mixed")
    with pytest.raises(ValueError, match="fp8 is not supported on GAUDI"):
        HPUDeepSpeedPrecisionPlugin("fp8")


def test_user_config_dict_is_not_modified():
    config = {"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}
    strategy = HPUDeepSpeedStrategy(config=config)
    strategy.config["train_micro_batch_size_per_gpu"] = 4
    assert config == {"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}


# -- bad configurations ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"stage": 4}, "DeepSpeed ZeRO has stages 0, 1, 2 and 3"),
        ({"config": {"zero_optimization": {"stage": 7}}}, "ZeRO stage 7 does not exist"),
        ({"stage": 2, "offload_parameters": True}, "offload_parameters=True needs ZeRO stage 3"),
        ({"config": {"zero_optimization": {"stage": 1, "offload_param": {"device": "cpu"}}}},
         "Offloading parameters .* needs ZeRO stage 3, but stage is 1"),
        # lightning-habana's (and Lightning's) words first, then hpu_nb's
        ({"config": "/nonexistent/ds_config.json"}, "^You passed in a path to a DeepSpeed config but the path does not"
                                                    " exist: DeepSpeed config file '/nonexistent/ds_config.json'"),
    ],
)
def test_bad_configurations_are_clear_errors(kwargs, message):
    with pytest.raises(MisconfigurationException, match=message):
        HPUDeepSpeedStrategy(**kwargs)


def test_missing_deepspeed_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # import deepspeed -> ImportError
    with pytest.raises(MisconfigurationException, match=r"pip install 'hpu_nb\[deepspeed\]'"):
        HPUDeepSpeedStrategy()


def test_non_hpu_accelerator_is_refused_clearly():
    expected = "HPUDeepSpeedStrategy requires HPUAccelerator, got CPUAccelerator"
    with pytest.raises(MisconfigurationException, match=expected):
        L.Trainer(accelerator="cpu", devices=1, strategy=HPUDeepSpeedStrategy(), logger=False)


# -- real fits on the emulated Gaudi ----------------------------------------------------------------------------------
@pytest.mark.timeout(FIT_TIMEOUT)
@pytest.mark.parametrize("stage", [1])  # stage 3 runs in the 2-process test below
def test_single_process_zero_fit(tmp_path, stage):
    result = run_fit(tmp_path / "out", "--devices", "1", "--strategy", f"ds:{stage}", timeout=FIT_TIMEOUT - 10)
    assert result.returncode == 0, result.stderr[-3000:]
    (report,) = rank_reports(tmp_path / "out")
    assert report["strategy"] == "HPUDeepSpeedStrategy" and report["process_group_backend"] == "hccl"
    assert report["global_step"] == 8 and report["samples_seen"] == 64
    assert report["metrics"]["train_loss"] < 10


@pytest.mark.timeout(FIT_TIMEOUT)
def test_json_config_file_bf16_and_the_module_optimizer_wins(tmp_path):
    config = {
        "zero_optimization": {"stage": 2},
        "bf16": {"enabled": True},
        "zero_allow_untested_optimizer": True,
        "train_micro_batch_size_per_gpu": 8,
        "optimizer": {"type": "Adam", "params": {"lr": 0.001}},
        "activation_checkpointing": {"partition_activations": False, "cpu_checkpointing": True},
    }
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    result = run_fit(tmp_path / "out", "--devices", "1", "--strategy", f"ds-config:{path}", timeout=FIT_TIMEOUT - 10)
    assert result.returncode == 0, result.stderr[-3000:]
    (report,) = rank_reports(tmp_path / "out")
    assert report["optimizer"] == "SGD"  # configure_optimizers() wins over the config's Adam
    assert report["global_step"] == 8
    # bf16 from the config: the batches reached training_step in bfloat16, so their sum is rounded
    from tests.dist_scripts.fit import data

    x_all = torch.cat([x for x, _ in data()])
    exact = float(x_all[:, 0].sum())
    in_bf16 = float(sum(float(x[:, 0].to(torch.bfloat16).sum()) for x, _ in data()))
    assert report["first_index_sum"] != exact
    assert report["first_index_sum"] == pytest.approx(in_bf16, abs=0.05)


@pytest.mark.timeout(FIT_TIMEOUT)
@pytest.mark.parametrize("stage", [2, 3])
def test_two_process_zero_fit_and_checkpoint_loads_into_a_single_device_run(tmp_path, stage):
    ckpt = tmp_path / "ds.ckpt"
    result = run_fit(tmp_path / "out", "--devices", "2", "--strategy", f"ds:{stage}", "--ckpt", str(ckpt),
                     "--precision", "bf16-mixed", timeout=FIT_TIMEOUT - 10)
    assert result.returncode == 0, result.stderr[-3000:]
    reports = rank_reports(tmp_path / "out")
    assert [r["rank"] for r in reports] == [0, 1] and [r["samples_seen"] for r in reports] == [32, 32]
    assert reports[0]["metrics"]["rank_sum"] == 3.0
    assert ckpt.is_dir() and len(list((ckpt / "checkpoint").glob("*optim_states.pt"))) == 2  # one shard per rank

    # consolidate the ZeRO shards into one Lightning checkpoint and load it into a single-device run
    from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

    single_file = tmp_path / "single.ckpt"
    convert_zero_checkpoint_to_fp32_state_dict(ckpt, single_file)
    from tests.dist_scripts.fit import Model

    model = Model.load_from_checkpoint(single_file, map_location="cpu")
    trained = torch.load(tmp_path / "out" / "weights.pt")
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value.float(), trained[name], atol=1e-2, rtol=1e-2)
    from tests.dist_scripts.fit import data

    trainer = L.Trainer(accelerator="hpu", devices=1, max_epochs=1, logger=False, enable_progress_bar=False,
                        enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(model, data())  # the consolidated weights keep training on one card
    assert trainer.global_step == 8 and torch.isfinite(trainer.callback_metrics["train_loss"])


@pytest.mark.timeout(FIT_TIMEOUT)
def test_stage_2_with_optimizer_offload_saves_and_resumes(tmp_path):
    ckpt = tmp_path / "ds.ckpt"
    first = run_fit(tmp_path / "a", "--devices", "1", "--strategy", "ds:2:offload", "--ckpt", str(ckpt),
                    timeout=FIT_TIMEOUT - 10)
    assert first.returncode == 0, first.stderr[-3000:]
    again = run_fit(tmp_path / "b", "--devices", "1", "--strategy", "ds:2:offload", "--resume", str(ckpt),
                    "--epochs", "2", timeout=FIT_TIMEOUT - 10)
    assert again.returncode == 0, again.stderr[-3000:]
    reports = rank_reports(tmp_path / "b")
    assert [r["global_step"] for r in reports] == [16]  # 8 steps restored + 8 more
    assert [r["samples_seen"] for r in reports] == [64]  # only the second epoch ran

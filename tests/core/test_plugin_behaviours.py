"""Behaviours lightning-habana's users rely on (the strategy side), rewritten from what the
plugin's own tests assert: strategies usable before a Trainer exists, HPU strategies refusing other accelerators, a
custom strategy in the registry, HPUProfiler.profile_hpu_activities, the ZeRO-Infinity name, FSDP CPU offload,
DeepSpeed fp16 and DeepSpeed activation checkpointing on the CPU."""

from __future__ import annotations

import json

import lightning as L
import pytest
import torch
from lightning.fabric import Fabric
from lightning.pytorch.plugins import CheckpointIO
from lightning.pytorch.strategies import StrategyRegistry
from lightning.pytorch.utilities.exceptions import MisconfigurationException

import hpu_nb
import hpu_nb.fabric as hpu_fabric
from hpu_nb import (
    HPUAccelerator,
    HPUCheckpointIO,
    HPUDDPStrategy,
    HPUDeepSpeedPrecisionPlugin,
    HPUDeepSpeedStrategy,
    HPUFSDPStrategy,
    HPUParallelStrategy,
    HPUProfiler,
    SingleHPUStrategy,
)
from hpu_nb.core.precision import UnsupportedPrecisionError
from tests.core.test_parallel import rank_reports, run_fit

TWO = [torch.device("hpu")] * 2


# -- strategies built before a Trainer exists (the plugin's test_hpu_parallel / test_hpu_ddp) --
@pytest.mark.parametrize("make", [
    lambda: HPUParallelStrategy(parallel_devices=TWO),
    lambda: HPUDDPStrategy(parallel_devices=TWO),
    lambda: HPUFSDPStrategy(parallel_devices=TWO),
    lambda: HPUDeepSpeedStrategy(parallel_devices=TWO),
    lambda: hpu_fabric.HPUParallelStrategy(parallel_devices=TWO),
    lambda: hpu_fabric.HPUFSDPStrategy(parallel_devices=TWO),
], ids=["parallel", "ddp", "fsdp", "deepspeed", "fabric-parallel", "fabric-fsdp"])
def test_a_strategy_with_parallel_devices_works_before_a_trainer(make):
    strategy = make()
    assert strategy.accelerator is None and strategy.cluster_environment is None
    assert strategy.parallel_devices == TWO and strategy.num_processes == 2
    assert strategy.root_device == torch.device("hpu", 0)
    assert strategy.process_group_backend == "hccl"
    obj = {"weights": torch.randn(2, 2)}
    assert strategy.broadcast(obj) is obj  # no process group yet: the object itself
    with strategy.tensor_init_context():
        module = torch.nn.Linear(2, 2)
    # the Trainer's FSDP (Lightning's rule) creates on the host and moves each shard to the card when it wraps
    expected = "cpu" if type(strategy) is HPUFSDPStrategy else "hpu"
    assert module.weight.device.type == module.bias.device.type == expected


def test_parallel_strategy_defaults_as_the_plugin_s():
    strategy = HPUParallelStrategy(parallel_devices=[torch.device("hpu")])
    assert strategy.strategy_name == "hpu_parallel" and isinstance(strategy.checkpoint_io, HPUCheckpointIO)
    assert strategy._num_nodes == 1 and strategy._timeout is not None


@pytest.mark.parametrize("strategy", [
    lambda: SingleHPUStrategy(), lambda: HPUParallelStrategy(), lambda: HPUDDPStrategy(start_method="spawn"),
    lambda: HPUFSDPStrategy(), lambda: HPUDeepSpeedStrategy()], ids=["single", "parallel", "ddp", "fsdp", "deepspeed"])
def test_trainer_hpu_strategies_refuse_another_accelerator(strategy):
    made = strategy()
    with pytest.raises(MisconfigurationException, match=f"{type(made).__name__} requires HPUAccelerator, got CPUAcc"):
        L.Trainer(accelerator="cpu", devices=1, strategy=made, logger=False)


@pytest.mark.parametrize("strategy", [hpu_fabric.SingleHPUStrategy, hpu_fabric.HPUDDPStrategy,
                                      hpu_fabric.HPUFSDPStrategy], ids=["single", "ddp", "fsdp"])
def test_fabric_hpu_strategies_refuse_another_accelerator(strategy):
    with pytest.raises(ValueError, match="requires HPUAccelerator, got CPUAccelerator"):
        Fabric(accelerator="cpu", devices=1, strategy=strategy())


def test_a_custom_parallel_strategy_in_the_registry():
    class CustomCheckpointIO(CheckpointIO):
        def save_checkpoint(self, checkpoint, path, storage_options=None):
            pass

        def load_checkpoint(self, path, map_location=None):
            return {}

        def remove_checkpoint(self, path):
            pass

    class CustomParallelStrategy(HPUParallelStrategy):
        strategy_name = "custom_hpu_parallel"

    StrategyRegistry.register("hpu_parallel_custom_strategy", CustomParallelStrategy, description="custom",
                              checkpoint_io=CustomCheckpointIO(), override=True)
    try:
        trainer = L.Trainer(strategy="hpu_parallel_custom_strategy", accelerator=HPUAccelerator(), devices=1,
                            logger=False)
        assert isinstance(trainer.strategy, CustomParallelStrategy)
        assert isinstance(trainer.strategy.checkpoint_io, CustomCheckpointIO)  # the user's IO, not the default
    finally:
        StrategyRegistry.remove("hpu_parallel_custom_strategy")


# -- profiler ---------------------------------------------------------------------------------------------------------
def test_profile_hpu_activities_on_the_emulated_gaudi(tmp_path):
    profiler = HPUProfiler(dirpath=tmp_path)
    cpu = torch.profiler.ProfilerActivity.CPU
    assert profiler.profile_hpu_activities([cpu]) == [cpu]  # no HPU activity to record here (said in the trace)
    assert profiler.activities == [cpu]


def test_profile_hpu_activities_on_a_gaudi(fake_gaudi, tmp_path):
    profiler = HPUProfiler(dirpath=tmp_path)
    activity = torch.profiler.ProfilerActivity  # the Enum habana_frameworks installed
    assert profiler.profile_hpu_activities([activity.CPU]) == [activity.CPU, activity.HPU]
    assert profiler.profile_hpu_activities([activity.CPU, activity.HPU]) == [activity.CPU, activity.HPU]
    assert profiler.activities == [activity.CPU, activity.HPU]


# -- DeepSpeed --
def test_zero_infinity_name_offloads_to_nvme(tmp_path):
    entry = StrategyRegistry["hpu_deepspeed_stage_3_offload_nvme"]
    assert entry["strategy"] is HPUDeepSpeedStrategy
    strategy = entry["strategy"](**entry["init_params"])
    zero = strategy.config["zero_optimization"]
    assert zero["stage"] == 3
    assert zero["offload_param"]["device"] == zero["offload_optimizer"]["device"] == "nvme"
    assert zero["offload_param"]["nvme_path"] == "/local_nvme"


def test_deepspeed_fp16_is_refused_up_front_where_the_gaudi_cannot(monkeypatch):
    monkeypatch.setenv("HPU_NB_DEVICE", "gaudi")  # first-generation Gaudi: no fp16
    hpu_nb.runtime.reset_backend()
    with pytest.raises(UnsupportedPrecisionError, match="fp16 is not supported on GAUDI"):
        HPUDeepSpeedPrecisionPlugin("16-mixed")
    with pytest.raises(UnsupportedPrecisionError, match="fp16 is not supported on GAUDI"):
        L.Trainer(accelerator="hpu", strategy=HPUDeepSpeedStrategy(), precision="16-mixed", logger=False)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("given_as", ["kwargs", "config"])
def test_deepspeed_init_inference_arguments_reach_the_inference_engine(given_as):
    """The plugin's inference tests: dtype / tensor_parallel / replace_with_kernel_inject, as strategy arguments or
    in the config, make predict() run through deepspeed.init_inference, with the model's own results."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPU_NB_", "DS_", "DEEPSPEED"))}
    env["PYTHONPATH"] = str(root)
    result = subprocess.run([sys.executable, str(root / "tests" / "dist_scripts" / "ds_inference.py"), given_as],
                            capture_output=True, text=True, timeout=280, env=env, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["engine"] == "InferenceEngine" and report["close"]
    assert report["inference_kwargs"] == (["dtype", "replace_with_kernel_inject", "tensor_parallel"]
                                          if given_as == "kwargs" else [])


@pytest.mark.timeout(300)
def test_deepspeed_fp16_trains_on_gaudi2(tmp_path):
    result = run_fit(tmp_path / "fp16", "--devices", "1", "--strategy", "ds:2", "--precision", "16-mixed", timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]
    (report,) = rank_reports(tmp_path / "fp16")
    assert report["global_step"] == 8 and report["metrics"]["train_loss"] < 20


@pytest.mark.timeout(400)
def test_deepspeed_cpu_checkpointing_recomputes_from_a_cpu_copy(tmp_path):
    """The plugin's activation-checkpointing example (ZeRO-3, optimizer offload, cpu_checkpointing=True) trains, and to
    the very same loss as without checkpointing: recomputation is exact."""
    losses = {}
    for spec in ("ds:3:offload:cpu_checkpointing", "ds:3:offload"):
        out = tmp_path / spec.replace(":", "_")
        result = run_fit(out, "--devices", "1", "--strategy", spec, "--precision", "bf16-mixed", timeout=180)
        assert result.returncode == 0, result.stderr[-3000:]
        (report,) = rank_reports(out)
        assert report["deepspeed_cpu_checkpoint"] is ("cpu_checkpointing" in spec)
        losses[spec] = report["metrics"]["train_loss"]
    assert losses["ds:3:offload:cpu_checkpointing"] == losses["ds:3:offload"]


# -- FSDP --------------------------------------------------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_fsdp_cpu_offload_keeps_parameters_on_the_host_and_trains_the_same(tmp_path):
    results = {}
    for spec in ("fsdp:full:offload", "fsdp:full"):
        out = tmp_path / spec.replace(":", "_")
        result = run_fit(out, "--devices", "2", "--strategy", spec, timeout=140)
        assert result.returncode == 0, result.stderr[-3000:]
        workers = [json.loads(p.read_text()) for p in sorted(out.glob("worker*.json"))]
        results[spec] = ([w["param_devices"] for w in workers], rank_reports(out)[0]["metrics"]["train_loss"])
    assert results["fsdp:full:offload"][0] == [["cpu"], ["cpu"]]  # sharded parameters live on the host
    assert results["fsdp:full"][0] == [["hpu:0"], ["hpu:0"]]
    assert results["fsdp:full:offload"][1] == pytest.approx(results["fsdp:full"][1], rel=1e-6)

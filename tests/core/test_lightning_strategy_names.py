"""Lightning's own multi-device strategy names with an HPU accelerator build hpu_nb's HPU strategies (issue 39): in a
notebook Lightning refuses "ddp" / "deepspeed" with the advice to use "ddp_notebook", whose DDPStrategy then died in
worker 1. A name without an HPU equivalent, or one that cannot start from a notebook, names what to use."""

from __future__ import annotations

import lightning as L
import pytest
from lightning.fabric import Fabric
from lightning.pytorch.trainer.connectors import accelerator_connector

import hpu_nb  # noqa: F401  (registers "hpu")
from hpu_nb import HPUDDPStrategy, HPUDeepSpeedStrategy, HPUFSDPStrategy
from hpu_nb.core.fabric.strategies import HPUDDPStrategy as FabricHPUDDPStrategy
from hpu_nb.core.fabric.strategies import HPUFSDPStrategy as FabricHPUFSDPStrategy


@pytest.fixture(params=[False, True], ids=["script", "notebook"])
def interactive(request, monkeypatch):
    monkeypatch.setattr(accelerator_connector, "_IS_INTERACTIVE", request.param)
    return request.param


def _trainer(strategy: str) -> L.Trainer:
    return L.Trainer(accelerator="hpu", devices=2, strategy=strategy, logger=False, enable_progress_bar=False,
                     enable_checkpointing=False, enable_model_summary=False)


@pytest.mark.parametrize("name, start_method, find_unused", [
    ("ddp", None, None), ("ddp_notebook", "fork", None), ("ddp_fork", "fork", None),
    ("ddp_find_unused_parameters_true", None, True), ("ddp_notebook_find_unused_parameters_false", "fork", False),
])
def test_lightnings_ddp_names_are_hpu_ddp_with_their_arguments(interactive, name, start_method, find_unused):
    strategy = _trainer(name).strategy
    assert type(strategy) is HPUDDPStrategy
    launcher = type(strategy.launcher).__name__
    if start_method is None:  # "ddp": hpu_nb's auto, fork in a notebook (Lightning refuses "ddp" there)
        assert launcher == ("HPUMultiProcessingLauncher" if interactive else "HPUSubprocessScriptLauncher")
    else:
        assert launcher == "HPUMultiProcessingLauncher" and strategy.launcher._start_method == start_method
    if find_unused is not None:
        assert strategy._ddp_kwargs == {"find_unused_parameters": find_unused}
    assert [d.type for d in strategy.parallel_devices] == ["hpu", "hpu"]


@pytest.mark.parametrize("name, stage, offload", [
    ("deepspeed", 2, False), ("deepspeed_stage_1", 1, False), ("deepspeed_stage_3_offload", 3, True),
])
def test_lightnings_deepspeed_names_are_hpu_deepspeed_with_their_stage(interactive, name, stage, offload):
    pytest.importorskip("deepspeed")
    trainer = _trainer(name)
    strategy = trainer.strategy
    assert type(strategy) is HPUDeepSpeedStrategy
    zero = strategy.config["zero_optimization"]
    assert zero["stage"] == stage and ("offload_optimizer" in zero) == offload
    assert type(trainer.precision_plugin).__name__ == "HPUDeepSpeedPrecisionPlugin"
    if interactive:
        assert strategy.launcher._start_method == "fork"


def test_lightnings_fsdp_names_are_hpu_fsdp(interactive, monkeypatch):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")  # FSDP runs in eager mode only
    strategy = _trainer("fsdp_cpu_offload").strategy
    assert type(strategy) is HPUFSDPStrategy and strategy.cpu_offload.offload_params


def test_ddp_spawn_in_a_notebook_names_the_strategies_that_start_there(monkeypatch):
    monkeypatch.setattr(accelerator_connector, "_IS_INTERACTIVE", True)
    with pytest.raises(ValueError, match="strategy='ddp_spawn'.*Use strategy='hpu_ddp' or 'ddp_notebook'"):
        _trainer("ddp_spawn")


def test_other_accelerators_keep_lightnings_strategies():
    from lightning.pytorch.strategies import DDPStrategy

    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False)
    assert type(trainer.strategy) is DDPStrategy


def test_fabric_names_too(monkeypatch):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    assert type(Fabric(accelerator="hpu", devices=2, strategy="ddp_notebook").strategy) is FabricHPUDDPStrategy
    assert type(Fabric(accelerator="hpu", devices=2, strategy="fsdp").strategy) is FabricHPUFSDPStrategy
    with pytest.raises(ValueError, match="no HPU DeepSpeedStrategy for the Fabric. Use strategy='hpu_ddp'"):
        Fabric(accelerator="hpu", devices=2, strategy="deepspeed")

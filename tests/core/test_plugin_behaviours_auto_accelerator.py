"""lightning-habana behaviours, second round (issue "lightning-habana's behaviours, second round"): each test restates
a behaviour the archived plugin's own tests check, written for hpu_nb (no code copied)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import lightning as L
import pytest
import torch

import hpu_nb.fabric as hpu_fabric
from hpu_nb import (
    HPUAccelerator,
    HPUDDPStrategy,
    HPUDeepSpeedPrecisionPlugin,
    HPUDeepSpeedStrategy,
    HPUParallelStrategy,
    HPUPrecisionPlugin,
    SingleHPUStrategy,
)


@pytest.mark.parametrize(
    "given",
    [
        dict(strategy=SingleHPUStrategy()),
        dict(strategy=HPUParallelStrategy()),
        dict(strategy=HPUDDPStrategy(), devices=1),
        dict(strategy="hpu_single"),
        dict(strategy="hpu_ddp", devices=1),
        dict(plugins=HPUPrecisionPlugin("bf16-mixed")),
        dict(plugins=[HPUPrecisionPlugin("bf16-mixed")]),
    ],
    ids=["single", "parallel", "ddp", "name-single", "name-ddp", "precision", "precision-list"],
)
def test_accelerator_auto_with_an_hpu_strategy_or_plugin_picks_the_hpu(given):
    trainer = L.Trainer(logger=False, **given)  # accelerator="auto", Lightning's default
    assert isinstance(trainer.accelerator, HPUAccelerator)
    assert trainer.strategy.root_device.type == "hpu"


def test_accelerator_auto_with_a_deepspeed_hpu_plugin_picks_the_hpu():
    pytest.importorskip("deepspeed")
    trainer = L.Trainer(logger=False, strategy=HPUDeepSpeedStrategy(), devices=1,
                        plugins=HPUDeepSpeedPrecisionPlugin("bf16-mixed"))
    assert isinstance(trainer.accelerator, HPUAccelerator)


@pytest.mark.parametrize("given", [dict(strategy=hpu_fabric.SingleHPUStrategy()),
                                   dict(plugins=hpu_fabric.HPUPrecision("bf16-mixed"))], ids=["strategy", "precision"])
def test_fabric_accelerator_auto_with_an_hpu_strategy_or_plugin_picks_the_hpu(given):
    fabric = L.Fabric(**given)
    assert isinstance(fabric.accelerator, hpu_fabric.HPUAccelerator)


def test_accelerator_auto_alone_stays_on_the_cpu_without_a_gaudi():
    """The emulated Gaudi is never chosen implicitly: only an HPU piece given explicitly means the HPU."""
    assert type(L.Trainer(logger=False).accelerator).__name__ == "CPUAccelerator"


def test_fabric_ddp_strategy_knows_its_devices_before_setup(monkeypatch):
    """lightning-habana's Fabric HPUDDPStrategy() had [hpu] * auto_device_count() at once; hpu_nb's had None."""
    monkeypatch.setenv("HPU_NB_DEVICE_COUNT", "2")
    for strategy in (hpu_fabric.HPUDDPStrategy(), hpu_fabric.HPUParallelStrategy()):
        assert [d.type for d in strategy.parallel_devices] == ["hpu", "hpu"]
        assert strategy.num_processes == 2 and strategy.root_device.type == "hpu"
    given = hpu_fabric.HPUDDPStrategy(parallel_devices=[torch.device("hpu")])
    assert given.num_processes == 1
    fabric = L.Fabric(strategy=hpu_fabric.HPUDDPStrategy(), devices=1)
    assert fabric.strategy.num_processes == 1  # Fabric's devices= still decides


def test_hccl_reduces_with_product_on_the_device():
    """HCCL has PRODUCT (hcclProd); the emulated HCCL refused it. Run in a fresh process: it makes an HCCL group."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import torch
        import torch.distributed as dist
        import habana_frameworks.torch.distributed.hccl  # registers "hccl", as on a Gaudi

        dist.init_process_group("hccl", store=dist.HashStore(), rank=0, world_size=1)
        t = torch.tensor([2.0, 3.0], device="hpu")
        dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
        print(t.tolist())
        dist.destroy_process_group()
    """)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[-2] == "[2.0, 3.0]"

"""lightning-habana behaviours, second round (issue "lightning-habana's behaviours, second round"): each test restates
a behaviour the archived plugin's own tests check, written for hpu_nb (no code copied)."""

from __future__ import annotations

import lightning as L
import pytest

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

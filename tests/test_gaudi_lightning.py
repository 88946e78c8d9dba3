"""The Lightning pieces on a (fake) Gaudi: what we ask of habana_frameworks from accelerator and strategy."""

from __future__ import annotations

import lightning as L
import torch

from hpu_nb import HPUAccelerator, SingleHPUStrategy
from tests.models import quiet_trainer_kwargs


def test_trainer_on_gaudi_uses_hpu_device_and_gaudi_stats(fake_gaudi):
    trainer = L.Trainer(**quiet_trainer_kwargs(accelerator="hpu", devices=1))
    assert isinstance(trainer.strategy, SingleHPUStrategy)
    assert trainer.strategy.root_device == torch.device("hpu", 0)
    from hpu_nb.runtime import hpu_device

    hpu_device.fresh_card()
    fake_gaudi.calls.clear()
    held = torch.empty(3 * 2**20, dtype=torch.uint8, device="hpu")  # noqa: F841
    stats = trainer.accelerator.get_device_stats(trainer.strategy.root_device)
    assert stats["InUse"] == 3 * 2**20
    assert fake_gaudi.calls.count("memory_stats") == 1
    assert HPUAccelerator.get_device_name() == "GAUDI2"
    assert HPUAccelerator.auto_device_count() == 8  # every card of the (fake) box


def test_auto_accelerator_picks_a_real_gaudi(fake_gaudi):
    trainer = L.Trainer(**quiet_trainer_kwargs(accelerator="auto", devices=1))
    assert isinstance(trainer.accelerator, HPUAccelerator)


def test_strategy_marks_steps_in_lazy_mode(fake_gaudi):
    strategy = SingleHPUStrategy()
    loss = torch.tensor(1.0)
    fake_gaudi.calls.clear()
    strategy.post_backward(loss)  # after backward
    assert fake_gaudi.calls.count("mark_step") == 1


def test_strategy_skips_mark_step_in_eager_mode(fake_gaudi, monkeypatch):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    fake_gaudi.calls.clear()
    SingleHPUStrategy().post_backward(torch.tensor(1.0))
    assert fake_gaudi.calls.count("mark_step") == 0

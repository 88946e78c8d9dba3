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


# -- real training on the (fake) Gaudi: the model lives on hpu, and we assert what was asked of Habana ---------------
def test_fit_on_the_fake_gaudi_trains_on_hpu_and_marks_steps(fake_gaudi):
    from tests.models import LinearModel, regression_data

    model = LinearModel(16)
    trainer = L.Trainer(**quiet_trainer_kwargs(accelerator="hpu", devices=1, max_steps=3, limit_val_batches=1))
    fake_gaudi.calls.clear()
    trainer.fit(model, regression_data(n=48, features=16, batch_size=16), regression_data(n=16, features=16))
    assert trainer.strategy.root_device == torch.device("hpu", 0) and trainer.global_step == 3
    # the fake's release runs in lazy mode: after backward and after the optimizer step, around each eval step
    # (sanity check 1 batch + 1 at the end of the epoch)
    assert fake_gaudi.calls.count("core.mark_step") == 3 * 2 + (1 + 1) * 2
    stats = trainer.accelerator.get_device_stats(trainer.strategy.root_device)
    assert fake_gaudi.calls.count("hpu.memory_stats") >= 1 and stats["MaxInUse"] > (16 * 16 + 16) * 4


def test_two_rank_ddp_on_the_fake_gaudi_trains_on_hpu_over_hccl(make_fake_gaudi, tmp_path):
    from tests.test_parallel import rank_reports, run_fit

    fake = make_fake_gaudi(device_count=2)
    env = fake.subprocess_env()
    fake_env = {key: env[key] for key in ("PYTHONPATH", "HPU_NB_FAKE_HABANA_CONFIG")}
    result = run_fit(tmp_path / "out", "--devices", "2", env={**fake_env, "HPU_NB_BACKEND": "gaudi"})
    assert result.returncode == 0, result.stderr[-3000:]
    reports = rank_reports(tmp_path / "out")
    assert [r["backend"] for r in reports] == ["gaudi", "gaudi"]
    assert [r["step_devices"] for r in reports] == [["hpu:0"], ["hpu:0"]]  # each rank's own card
    assert {r["process_group_backend"] for r in reports} == {"hccl"}
    assert reports[0]["metrics"]["rank_sum"] == 3.0 and [r["samples_seen"] for r in reports] == [32, 32]
    for report in reports:
        calls = report["habana_calls"]
        assert calls["initialize_distributed_hpu"] == 1  # HCCL prepared in every rank before its process group
        assert calls["mark_step"] == 4 * 2  # 4 steps per rank, lazy mode: after backward and after the step

"""The Lightning pieces on a (fake) Gaudi: what we ask of habana_frameworks from accelerator and strategy."""

from __future__ import annotations

import lightning as L
import torch

from hpu_nb import HPUAccelerator, SingleHPUStrategy
from tests.helpers.models import quiet_trainer_kwargs


def test_trainer_on_gaudi_uses_hpu_device_and_gaudi_stats(fake_gaudi):
    trainer = L.Trainer(**quiet_trainer_kwargs(accelerator="hpu", devices=1))
    assert isinstance(trainer.strategy, SingleHPUStrategy)
    assert trainer.strategy.root_device == torch.device("hpu", 0)
    from hpu_nb.emulator import hpu_device

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


def test_strategy_marks_steps_in_lazy_mode(make_fake_gaudi):
    fake = make_fake_gaudi(release="1.18.0")
    strategy = SingleHPUStrategy()
    loss = torch.tensor(1.0)
    fake.calls.clear()
    strategy.post_backward(loss)  # after backward
    assert fake.calls.count("mark_step") == 1


def test_strategy_skips_mark_step_in_eager_mode(make_fake_gaudi, monkeypatch):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    fake = make_fake_gaudi(release="1.18.0")  # lazy by default, but the variable says eager
    fake.calls.clear()
    SingleHPUStrategy().post_backward(torch.tensor(1.0))
    assert fake.calls.count("mark_step") == 0


# -- real training on the (fake) Gaudi: the model lives on hpu, and we assert what was asked of Habana ---------------
def _fit(fake, model=None, **trainer_kwargs):
    from tests.helpers.models import LinearModel, regression_data

    model = model if model is not None else LinearModel(16)
    trainer = L.Trainer(**quiet_trainer_kwargs(accelerator="hpu", devices=1, max_steps=3, limit_val_batches=1,
                                               **trainer_kwargs))
    fake.calls.clear()
    trainer.fit(model, regression_data(n=48, features=16, batch_size=16), regression_data(n=16, features=16))
    assert trainer.strategy.root_device == torch.device("hpu", 0) and trainer.global_step == 3
    return trainer


def test_fit_on_release_1_18_runs_lazy_with_mark_step_placed(make_fake_gaudi):
    fake = make_fake_gaudi(release="1.18.0")
    trainer = _fit(fake)
    # lazy mode: after backward and after the optimizer step, around each eval step (sanity check 1 batch + 1 at the
    # end of the epoch)
    assert fake.calls.count("core.mark_step") == 3 * 2 + (1 + 1) * 2
    import habana_frameworks.torch.core as htcore

    assert htcore.graphs_run == 3 * 2 + (1 + 1) * 2  # each one ended a graph
    stats = trainer.accelerator.get_device_stats(trainer.strategy.root_device)
    assert fake.calls.count("hpu.memory_stats") >= 1 and stats["MaxInUse"] > (16 * 16 + 16) * 4


def test_fit_on_release_1_21_runs_eager_without_mark_step(make_fake_gaudi):
    fake = make_fake_gaudi(release="1.21.0")
    trainer = _fit(fake)
    assert fake.calls.count("core.mark_step") == 0 and fake.calls.count("hpu_backend") == 0  # not asked to compile
    assert trainer.accelerator.get_device_stats(trainer.strategy.root_device)["MaxInUse"] > 0


class CompilableModel(L.LightningModule):
    """No self.log in the step: Lightning 2.6's log() does not trace under torch 2.13's dynamo (on any accelerator)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self(x).float(), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def test_fit_with_torch_compile_uses_habanas_hpu_backend_through_lightning(make_fake_gaudi):
    from tests.helpers.models import regression_data

    fake = make_fake_gaudi(release="1.21.0")
    torch._dynamo.reset()
    model = CompilableModel()
    compiled = torch.compile(model, backend="hpu_backend")
    trainer = L.Trainer(**quiet_trainer_kwargs(accelerator="hpu", devices=1, max_steps=3, limit_val_batches=0))
    before = model.layer.weight.detach().clone()
    fake.calls.clear()
    trainer.fit(compiled, regression_data(n=48, features=16, batch_size=16))
    assert trainer.global_step == 3 and not torch.equal(before, model.layer.weight.detach().cpu())
    assert fake.calls.count("hpu_backend") >= 1  # Lightning ran the training step through Habana's compiler
    assert fake.calls.count("core.mark_step") == 0


def test_two_rank_ddp_on_the_fake_gaudi_trains_on_hpu_over_hccl(make_fake_gaudi, tmp_path):
    from tests.core.test_parallel import rank_reports, run_fit

    fake = make_fake_gaudi(device_count=2, release="1.18.0")
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
        # once when Habana's HCCL module is imported, once by the strategy with the rank before its process group
        assert calls["initialize_distributed_hpu"] == 2
        assert calls["mark_step"] == 4 * 2  # 4 steps per rank, lazy mode: after backward and after the step

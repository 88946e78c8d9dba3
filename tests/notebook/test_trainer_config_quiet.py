"""The config widget's code is quiet by default (issue 39, item 5): a logger chosen in the form (TensorBoard where it
is installed, else none) instead of Lightning's default, which made a `lightning_logs/version_N` folder per run and,
without TensorBoard, warned "tensorboardX has been removed"; checkpoints only when asked."""

from __future__ import annotations

import warnings

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import hpu_nb  # noqa: F401  (registers "hpu")
from hpu_nb.notebook.trainer_config import TrainerConfig, choices

RUN = {"max_steps": 3, "log_every_n_steps": 1, "enable_progress_bar": False, "enable_model_summary": False}


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(cfg: TrainerConfig) -> list[str]:
    """Run the generated code as a user's cell runs it, then fit; the warnings it raised."""
    namespace: dict = {}
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(32, 8, generator=gen)
    data = DataLoader(TensorDataset(x, x[:, :1]), batch_size=8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(cfg.code, "<generated>", "exec"), namespace)
        namespace["trainer"].fit(Tiny(), data)
    return [str(w.message) for w in caught]


LOGGERS = ["none", "csv"] + (["tensorboard"] if choices.tensorboard_installed() else [])


@pytest.mark.parametrize("logger", LOGGERS)
def test_the_generated_code_writes_only_what_the_form_chose(logger, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    messages = _fit(TrainerConfig(logger=logger, extra=RUN))
    assert not any("tensorboardX" in m or "lightning[extra]" in m for m in messages), messages
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert not any("lightning_logs" in p or "checkpoints" in p for p in written), written
    if logger == "none":
        assert written == []
    elif logger == "csv":
        assert "csv_logs/hpu_nb/version_0/metrics.csv" in written, written
    else:
        assert any(p.startswith("tb_logs/hpu_nb/version_0/events.out.tfevents") for p in written), written


def test_checkpoints_only_when_asked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _fit(TrainerConfig(logger="none", checkpointing=True, extra=RUN))
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["epoch=0-step=3.ckpt"]
    assert not (tmp_path / "lightning_logs").exists()


def test_the_default_logger_is_tensorboard_where_installed_else_none(monkeypatch):
    code = TrainerConfig().code
    assert "enable_checkpointing=False" in code and "lightning_logs" not in code
    if choices.tensorboard_installed():
        assert TrainerConfig().logger == "tensorboard"
        assert 'logger=TensorBoardLogger(save_dir="tb_logs", name="hpu_nb")' in code
        assert "from lightning.pytorch.loggers import TensorBoardLogger" in code
    monkeypatch.setattr(choices, "tensorboard_installed", lambda: False)
    assert choices.default_logger() == "none"
    monkeypatch.setattr("hpu_nb.notebook.trainer_config.model.tensorboard_installed", lambda: False)
    (error,) = TrainerConfig(logger="tensorboard").errors
    assert error.field == "logger" and "pip install tensorboard" in error.message
    assert "logger=False" in TrainerConfig(logger="none").code


def test_a_logger_in_extra_wins_over_the_form():
    code = TrainerConfig(logger="csv", extra={"logger": False, "enable_checkpointing": True}).code
    assert "CSVLogger" not in code and "logger=False" in code and "enable_checkpointing=True" in code

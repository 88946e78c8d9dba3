"""Run in the fresh venv: train a small model with Trainer(accelerator="hpu") and report what ran where (JSON)."""

from __future__ import annotations

import json

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 1)
        self.devices: set[str] = set()
        self.losses: list[float] = []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        self.devices.add(str(x.device))
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    import hpu_nb

    torch.manual_seed(0)
    x = torch.randn(64, 8)
    y = x @ torch.randn(8, 1)
    model = Regressor()
    trainer = L.Trainer(accelerator="hpu", devices=1, max_epochs=5, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, DataLoader(TensorDataset(x, y), batch_size=16))
    print(json.dumps({"hpu_nb": hpu_nb.__file__, "devices": sorted(model.devices), "losses": model.losses,
                      "accelerator": type(trainer.accelerator).__name__}))

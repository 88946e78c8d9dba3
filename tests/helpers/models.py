"""Small LightningModules and data shared by the tests."""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class LinearModel(L.LightningModule):
    """One Linear(features, features) trained with plain SGD on a regression target."""

    def __init__(self, features: int = 1024, lr: float = 0.01) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(features, features)
        self.lr = lr
        self.seen_dtypes: list[torch.dtype] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self(x)
        self.seen_dtypes.append(out.dtype)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self(x).float(), y))

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def regression_data(n: int = 64, features: int = 1024, batch_size: int = 16, seed: int = 0) -> DataLoader:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=gen)
    y = torch.randn(n, features, generator=gen)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size)


def quiet_trainer_kwargs(**overrides):
    """Trainer arguments that keep test output and disk use small."""
    kwargs = dict(
        max_epochs=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
    )
    kwargs.update(overrides)
    return kwargs

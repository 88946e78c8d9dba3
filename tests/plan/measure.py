"""The emulated card's own answer to what a plan predicts: a real Trainer.fit of two steps on the emulated Gaudi,
its MaxInUse read from the card's counters (exact to the byte) after resetting the peak on an empty card."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader, Dataset

from hpu_nb.runtime import get_backend


class _Repeat(Dataset):
    """The same batch, `steps` times (batch_size=None: the DataLoader hands it over as it is)."""

    def __init__(self, batch: Any, steps: int) -> None:
        self.batch, self.steps = batch, steps

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, index: int) -> Any:
        return self.batch


def measured_peak(model: LightningModule, batch: Any, *, precision: str = "32-true", steps: int = 2,
                  **trainer_kwargs: Any) -> int:
    """MaxInUse of the emulated card over `steps` training steps of a real Trainer, from an empty card."""
    backend = get_backend()
    torch.manual_seed(0)
    loader = DataLoader(_Repeat(batch, steps), batch_size=None)
    trainer = Trainer(accelerator="hpu", devices=1, max_steps=steps, precision=precision, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, **trainer_kwargs)
    if backend.memory_stats()["InUse"] != 0:
        raise RuntimeError(f"the card is not empty ({backend.memory_stats()['InUse']} B in use): measure on an empty "
                           "card")
    backend.reset_peak_memory_stats()
    trainer.fit(model, loader)
    return backend.memory_stats()["MaxInUse"]

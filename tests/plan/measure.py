"""The emulated card's own answer to what a plan predicts: a real Trainer.fit of two steps on the emulated Gaudi,
its MaxInUse read from the card's counters (exact to the byte) after resetting the peak, less what was already
on the card."""

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
    if precision == "fp8":  # fp8 as it trains: nn.Linear swapped for the fp8 layers
        from hpu_nb import HPUPrecisionPlugin

        trainer_kwargs["plugins"] = [HPUPrecisionPlugin("fp8", replace_layers=True)]
    else:
        trainer_kwargs["precision"] = precision
    trainer = Trainer(accelerator="hpu", devices=1, max_steps=steps, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, **trainer_kwargs)
    already = backend.memory_stats()["InUse"]  # what earlier runs left on the card (a few bytes of fp8 state)
    backend.reset_peak_memory_stats()
    trainer.fit(model, loader)
    return backend.memory_stats()["MaxInUse"] - already

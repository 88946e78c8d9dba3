"""habana_dataloader, emulated: Habana's `HabanaDataLoader`, which Model-References' scripts import by name.

On a Gaudi, `HabanaDataLoader(dataset, batch_size=..., ...)` decodes ImageFolder (ResNet) and COCO (SSD) datasets on
the card's media pipeline, and for anything it cannot take falls back to torch's DataLoader with the same arguments,
saying so ("Running with PyTorch Dataloader"; DATALOADER_FALLBACK_EN="" turns the fallback off). The emulated Gaudi
has no media pipeline, so every dataset takes the fallback: the same batches torch's DataLoader gives, one line that
says why. Modelled on the habana_dataloader package of Gaudi software 1.2x (gaudi-pytorch-bridge's
pytorch_helpers/dataloader/habana_dataloader/habana_dataset.py: its wrapper's __iter__ / __next__ / __len__, its
`dataloader` attribute and no other: nothing is forwarded to the DataLoader).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import torch.utils.data

__emulated__ = True
__all__ = ["HabanaDataLoader"]

FALLBACK_ENV = "DATALOADER_FALLBACK_EN"  # Habana reads it with os.getenv(name, True): only "" turns the fallback off


class HabanaDataLoader:
    """A torch DataLoader with HabanaDataLoader's face: every argument goes to `torch.utils.data.DataLoader`.

    Its attributes are those of Habana's wrapper for a dataset it falls back on: `dataloader` (the torch DataLoader)
    and, once iterated, `iter`. Habana's forwards nothing to the DataLoader, so `loader.batch_size` / `.sampler` /
    `.dataset` raise AttributeError here as on a Gaudi (Model-References' scripts reach through `loader.dataloader`),
    saying where the attribute is."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        reason = "the emulated Gaudi has no media pipeline (Habana's image decoder on the card)"
        if os.environ.get(FALLBACK_ENV) == "":
            print(f"Habana dataloader configuration failed: {reason}")
            raise RuntimeError(f"HabanaDataLoader: {reason}, and {FALLBACK_ENV} is empty, which turns off Habana's"
                               " fallback to PyTorch's DataLoader: unset it to train with PyTorch's DataLoader.")
        print(f"Failed to initialize Habana Dataloader, error: {reason}\nRunning with PyTorch Dataloader")
        self.dataloader = torch.utils.data.DataLoader(*args, **kwargs)

    def __iter__(self) -> Iterator[Any]:
        self.iter = iter(self.dataloader)
        return self  # type: ignore[return-value]  # as Habana's: the loader is its own iterator

    def __next__(self) -> Any:
        return next(self.iter)

    def __len__(self) -> int:
        return len(self.dataloader)

    def __getattr__(self, name: str) -> Any:
        """Only reached for a missing attribute: the AttributeError a Gaudi raises, with where the attribute is."""
        loader = self.__dict__.get("dataloader")
        where = (f"; the DataLoader's is `loader.dataloader.{name}`" if loader is not None and hasattr(loader, name)
                 else "")
        raise AttributeError(f"'HabanaDataLoader' object has no attribute {name!r} (Habana's HabanaDataLoader"
                             f" forwards no attribute to the DataLoader it wraps{where})")

"""Fake `habana_dataloader` (Habana's media loader) for the fake Gaudi: which loader Habana picks and how it reads the
keywords, modelled on the bridge's pytorch_helpers/dataloader/habana_dataloader/habana_dataloader/habana_dataset.py.

- An image-folder dataset (torchvision's ImageFolder: `root`, `transform`, `imgs`) goes to the ResNet loader; anything
  else falls back to torch's DataLoader with the same arguments (Habana: no loader type, the error caught).
- Gaudi2 (media pipe): samplers are ignored (only printed); `shuffle` is taken as given when the keyword is present;
  when absent it is True for a RandomSampler or a DistributedSampler(shuffle=True). The pipe shards the data over
  torch.distributed's world itself and reshuffles every epoch with its own seed.
- First-generation Gaudi (aeon): shuffle must be absent or False, num_workers 8, pin_memory True; training folders
  (a RandomResizedCrop in their transforms) are shuffled by the manifest, validation folders are not.
- Any other device (Gaudi3 here): "Unsupported device", torch's DataLoader instead.
A ValueError of a keyword check also falls back to torch's DataLoader, as Habana's does. Batches are the dataset's own
samples, collated by torch: the fake decodes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler
from torch.utils.data._utils.collate import default_collate

__all__ = ["HabanaDataLoader"]

BUILT: list[HabanaDataLoader] = []  # every loader built while the fake is installed, for the tests
MEDIA_SEED = 1234  # the media pipe's own seed: not the sampler's
AEON_SEED = 5  # aeon's file_shuffle_seed


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def _is_image_folder(dataset: Any) -> bool:
    return all(hasattr(dataset, name) for name in ("root", "transform", "imgs"))


def _enforce(kwargs: dict[str, Any], name: str, expected: Any, allow_default: bool = True) -> None:
    if not allow_default and kwargs.get(name) is None:
        raise ValueError(f"'{name}' is supported only as {expected}")
    if kwargs.get(name) is not None and kwargs.get(name) != expected:
        raise ValueError(f"'{name}' is supported only as {expected}")


class _FolderLoader:
    """The media pipe / aeon reading an image folder: an order per epoch, this instance's share, batches."""

    def __init__(self, dataset: Any, batch_size: int, shuffle: bool, drop_last: bool, seed: int) -> None:
        self.dataset, self.batch_size, self.shuffle, self.drop_last, self.seed = (
            dataset, batch_size, shuffle, drop_last, seed)
        self.num_instances, self.instance_id = _world()
        self.epoch = 0

    def _indices(self) -> list[int]:
        n = len(self.dataset)
        if self.shuffle:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
        else:
            order = list(range(n))
        return order[self.instance_id::self.num_instances]

    def __len__(self) -> int:
        n = len(self._indices())
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        indices = self._indices()
        self.epoch += 1
        for start in range(0, len(indices), self.batch_size):
            chunk = indices[start:start + self.batch_size]
            if len(chunk) < self.batch_size:
                if self.drop_last:
                    return
                chunk = chunk + indices[: self.batch_size - len(chunk)]  # "round up of last batch"
            yield default_collate([self.dataset[i] for i in chunk])


def _media_shuffle(kwargs: dict[str, Any]) -> bool:
    """ResnetDataLoader._media_dl_handle_vars: the keyword wins; only without it does the sampler's kind count."""
    if "shuffle" in kwargs:
        return bool(kwargs["shuffle"])
    sampler = kwargs.get("sampler")
    return isinstance(sampler, RandomSampler) or (isinstance(sampler, DistributedSampler) and sampler.shuffle)


def _resnet_loader(kwargs: dict[str, Any]) -> tuple[str, _FolderLoader]:
    from habana_frameworks.torch.utils import experimental as htexp

    device_type = htexp._get_device_type()
    dataset = kwargs.get("dataset")
    if not dataset:
        raise ValueError("'dataset' can not be None")
    batch_size = kwargs.get("batch_size", 1)
    if device_type == htexp.synDeviceType.synDeviceGaudi2:
        for name, expected in (("batch_sampler", None), ("collate_fn", None), ("timeout", 0),
                               ("worker_init_fn", None), ("multiprocessing_context", None), ("generator", None),
                               ("persistent_workers", False)):
            _enforce(kwargs, name, expected)
        return "media", _FolderLoader(dataset, batch_size, _media_shuffle(kwargs), kwargs.get("drop_last", False),
                                      MEDIA_SEED)
    if device_type == htexp.synDeviceType.synDeviceGaudi:
        for name, expected, allow_default in (("shuffle", False, True), ("batch_sampler", None, True),
                                              ("num_workers", 8, True), ("collate_fn", None, True),
                                              ("pin_memory", True, False), ("prefetch_factor", 2, True)):
            _enforce(kwargs, name, expected, allow_default)
        steps = getattr(dataset.transform, "transforms", [dataset.transform])
        is_train = any(type(step).__name__ == "RandomResizedCrop" for step in steps)
        return "aeon", _FolderLoader(dataset, batch_size, is_train, kwargs.get("drop_last", False), AEON_SEED)
    raise ValueError("Unsupported device")


class HabanaDataLoader:
    """Habana's loader: `kind` is "media", "aeon" or "torch" (the fall-back); `shuffle` what it decided (both for the
    tests). Like Habana's wrapper it forwards no attribute to its `dataloader`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.arguments = dict(kwargs)
        dataset = kwargs.get("dataset", args[0] if args else None)
        self.kind, self.shuffle = "torch", None
        loader: Any = None
        if _is_image_folder(dataset):
            try:
                self.kind, loader = _resnet_loader(kwargs)
                self.shuffle = loader.shuffle
            except (ValueError, ImportError) as err:
                print(f"Failed to initialize Habana Dataloader, error: {err}\nRunning with PyTorch Dataloader")
                self.kind = "torch"
        else:  # Habana calls its loader type, None for such a dataset, and catches the TypeError
            print("Failed to initialize Habana Dataloader, error: 'NoneType' object is not callable\n"
                  "Running with PyTorch Dataloader")
        self.dataloader = loader if loader is not None else DataLoader(*args, **kwargs)
        BUILT.append(self)

    def __iter__(self) -> Iterator[Any]:
        self.iter = iter(self.dataloader)
        return self  # type: ignore[return-value]  # as Habana's: the loader is its own iterator

    def __next__(self) -> Any:
        return next(self.iter)

    def __len__(self) -> int:
        return len(self.dataloader)

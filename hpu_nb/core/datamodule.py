"""HPUDataModule: ImageNet-style image folders loaded with Habana's media loader on a Gaudi, and with a plain torch
DataLoader given the same arguments on the emulated Gaudi.

Modelled on lightning-habana's `HPUDataModule` (same name and constructor arguments; written anew): on a Gaudi it
feeds `habana_dataloader.HabanaDataLoader`, whose rules (shuffle=False, pin_memory=True, num_workers=8, a few
torchvision transforms, ImageNet folders) are enforced in `setup()`. Here those rules are checked on every backend, so
a data module that sets up on the emulated Gaudi also sets up on a real one.

Training data is shuffled on every backend. Habana's media loader (Gaudi2) ignores samplers, and shuffles only when
its `shuffle` keyword is absent and the sampler is a RandomSampler or a shuffling DistributedSampler (the bridge's
`habana_dataloader/habana_dataset.py`, `ResnetDataLoader._media_dl_handle_vars`); the plugin passed shuffle=False
beside its sampler, so ImageNet training data was never shuffled on a Gaudi2. The training loader is therefore built
without a `shuffle` keyword (torch's DataLoader and Habana's fall-backs follow the sampler; Habana's aeon loader, on
first-generation Gaudi, shuffles training folders itself); evaluation loaders pass shuffle=False.
"""

from __future__ import annotations

from collections.abc import Iterable, Sized
from typing import Any, cast

import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, RandomSampler, SequentialSampler
from typing_extensions import override

from hpu_nb.runtime import get_backend

__all__ = ["HPUDataModule"]

# The only torchvision transforms Habana's media loader can run (the plugin's lists): it re-implements them on the
# device's media engine, so anything else has no equivalent there.
TRAIN_TRANSFORMS = ("RandomResizedCrop", "RandomHorizontalFlip", "ToTensor", "Normalize")
VAL_TRANSFORMS = ("Resize", "CenterCrop", "ToTensor", "Normalize")
# Habana's loader only decodes ImageNet (ILSVRC2012); the plugin tells it by the folder's name.
IMAGENET_NAMES = ("imagenet", "ilsvrc2012")
HABANA_NUM_WORKERS = 8
# ImageNet statistics, the ones Habana's ResNet media pipe normalizes with.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# Default image sizes of Habana's ResNet media pipe: train crops 224 at random, val resizes to 256 and crops the centre.
CROP_SIZE = 224
VAL_RESIZE = 256


def habana_or_torch_loader() -> type:
    """The DataLoader class for this process's device: Habana's media loader on a Gaudi, torch's on the emulated one.

    Where the backend has no media engine (the emulated Gaudi), torch's DataLoader, given the same arguments, stands
    in for it.
    """
    if not get_backend().has_media_engine:
        return DataLoader
    try:
        import habana_dataloader  # noqa: PLC0415 -- lazy: optional, Gaudi only (Habana's media loader)
    except ImportError as err:
        raise ImportError(
            "HPUDataModule loads data with Habana's media loader on a Gaudi, and `habana_dataloader` cannot be imported"
            f" ({err}). Install Intel Gaudi's `habana_dataloader` package of the same software release as your"
            " habana_frameworks (it ships with Gaudi's PyTorch software), or build your own DataLoaders without"
            " HPUDataModule."
        ) from err
    loader: type = habana_dataloader.HabanaDataLoader
    return loader


class HPUDataModule(LightningDataModule):
    """Train / validation data for a Gaudi: ImageNet-style folders (`train_dir`, `val_dir`) or datasets you supply.

    Habana's media loader on a Gaudi, a plain torch DataLoader with the same arguments elsewhere. Its rules are
    checked in `setup()` on every backend, each with a ValueError that says what to change: shuffle=False (training
    data is shuffled all the same: by the sampler, or on a Gaudi2 by the media loader), pin_memory=True,
    num_workers=8; and for image folders, ImageNet-named directories, drop_last=True
    and only the transforms the media loader runs (train: RandomResizedCrop, RandomHorizontalFlip, ToTensor,
    Normalize; val: Resize, CenterCrop, ToTensor, Normalize).

    `train_dataset` / `val_dataset` (any map-style torch Dataset) replace the folder of that split: no torchvision is
    needed for it, and the ImageNet-name, drop_last and transform rules do not apply to it (Habana's loader only
    accelerates ImageNet folders and falls back to torch's loading for other data). Without them,
    `torchvision.datasets.ImageFolder` reads the folders; torchvision is imported only then.

    `train_transforms` / `val_transforms` are lists of torchvision transforms (or a `Compose`). When left None the
    defaults of Habana's ResNet media pipe are used (train: RandomResizedCrop(224), RandomHorizontalFlip, ToTensor;
    val: Resize(256), CenterCrop(224), ToTensor), and `normalize=True` adds ImageNet's mean/std Normalize to them;
    `normalize` does not touch transforms you pass.

    pin_memory: torch's DataLoader pins for the current accelerator (torch >= 2.6 reads `torch.accelerator`). On the
    emulated Gaudi that is `hpu`, whose host memory is the device's, so pinning is a no-op and torch does not warn;
    the flag is passed as given so the same arguments reach Habana's loader on a Gaudi.

    num_workers=8 holds on the emulated Gaudi too, so torch starts 8 worker processes per loader (and warns on
    machines with fewer cores): the price of code that runs unchanged on a Gaudi. With several cards and
    distributed=False, Lightning swaps the samplers for its own DistributedSampler (use_distributed_sampler=True);
    distributed=True keeps this module's, seeded with `seed`.
    """

    name = "hpu-dataset"

    def __init__(
        self,
        train_dir: str | None = None,
        val_dir: str | None = None,
        num_workers: int = HABANA_NUM_WORKERS,
        normalize: bool = False,
        seed: int = 42,
        batch_size: int = 32,
        train_transforms: Any = None,
        val_transforms: Any = None,
        pin_memory: bool = True,
        shuffle: bool = False,
        drop_last: bool = True,
        distributed: bool = False,
        *,
        train_dataset: Dataset[Any] | None = None,
        val_dataset: Dataset[Any] | None = None,
    ) -> None:
        super().__init__()
        self.train_dir = train_dir
        self.val_dir = val_dir
        self.num_workers = num_workers
        self.normalize = normalize
        self.seed = seed
        self.batch_size = batch_size
        self.train_transforms = train_transforms
        self.val_transforms = val_transforms
        self.pin_memory = pin_memory
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.distributed = distributed
        self.train_dataset = train_dataset
        self.val_dataset = val_dataset
        self.dataset_train: Dataset[Any] | None = None
        self.dataset_val: Dataset[Any] | None = None
        self.loader_class: type | None = None

    @override
    def setup(self, stage: str | None = None) -> None:
        """Check the media loader's rules, build the datasets and pick the loader (errors surface before training).

        The training set is built for stage "fit" (or None, a manual call) only: scanning ImageNet's training folder
        takes a while, and validate / test need only the validation data.
        """
        self._check_loader_arguments()
        if stage in (None, "fit"):
            self.dataset_train = self._dataset("train", self.train_dataset, self.train_dir, self.train_transforms)
        self.dataset_val = self._dataset("val", self.val_dataset, self.val_dir, self.val_transforms)
        self.loader_class = habana_or_torch_loader()

    @override
    def train_dataloader(self) -> Any:
        """Batches in a random order: seeded with `seed` (or this rank's share of it when `distributed`) where the
        sampler is followed; on a Gaudi2's media loader, in the order of its own shuffling (it ignores samplers)."""
        dataset = self._ready(self.dataset_train, "train")
        if self.distributed:
            sampler: Any = DistributedSampler(dataset, shuffle=True, seed=self.seed)
        else:
            sampler = RandomSampler(cast(Sized, dataset), generator=torch.Generator().manual_seed(self.seed))
        return self._loader(dataset, sampler, ordered=False)

    @override
    def val_dataloader(self) -> Any:
        """Batches in dataset order (this rank's share when `distributed`), so every evaluation sees the same data."""
        return self._eval_loader()

    @override
    def test_dataloader(self) -> Any:
        """The validation data, in order: like the plugin's, this module has no separate test split."""
        return self._eval_loader()

    # -- internals ---------------------------------------------------------------------------------------------------
    def _eval_loader(self) -> Any:
        dataset = self._ready(self.dataset_val, "val")
        ordered = SequentialSampler(cast(Sized, dataset))  # _ready: a map-style dataset, which has __len__
        sampler = DistributedSampler(dataset, shuffle=False) if self.distributed else ordered
        return self._loader(dataset, sampler, ordered=True)

    def _loader(self, dataset: Dataset[Any], sampler: Any, *, ordered: bool) -> Any:
        """Both loaders take these keywords. `shuffle` is given (False) only for data read in order: Habana's media
        loader ignores the sampler and shuffles when the keyword is absent and the sampler shuffles."""
        assert self.loader_class is not None
        arguments: dict[str, Any] = {
            "dataset": dataset, "batch_size": self.batch_size, "num_workers": self.num_workers,
            "pin_memory": self.pin_memory, "drop_last": self.drop_last, "sampler": sampler,
        }
        if ordered:
            arguments["shuffle"] = False
        return self.loader_class(**arguments)

    def _ready(self, dataset: Dataset[Any] | None, split: str) -> Dataset[Any]:
        """The split's dataset, once `setup` built it: map-style, so Sized (`_dataset` refused the others)."""
        if dataset is None or self.loader_class is None:
            stage = "'fit'" if split == "train" else "'fit', 'validate' or 'test'"
            raise RuntimeError(f"HPUDataModule has no {split} data yet: call setup({stage}) first (the Trainer does).")
        return dataset

    def _check_loader_arguments(self) -> None:
        """The media loader's rules for every split (the plugin's `setup` checks, with the fix in each message; each
        message starts with the plugin's words, which its users' tests match)."""
        if self.shuffle:
            raise ValueError(
                "HabanaDataLoader does not support shuffle=True (HPUDataModule(shuffle=True): Habana's media loader)."
                " Pass shuffle=False;"
                " training data is still shuffled: by a RandomSampler seeded with `seed` (a DistributedSampler when"
                " distributed=True), or on a Gaudi2 by Habana's media loader itself."
            )
        if not self.pin_memory:
            raise ValueError(
                "HabanaDataLoader only supports pin_memory=True (HPUDataModule(pin_memory=False): Habana's media"
                " loader only supports pin_memory=True). Pass"
                " pin_memory=True (on the emulated Gaudi pinning costs nothing: host memory is the device's)."
            )
        if self.num_workers != HABANA_NUM_WORKERS:
            raise ValueError(
                f"HabanaDataLoader only supports num_workers as {HABANA_NUM_WORKERS} (HPUDataModule(num_workers="
                f"{self.num_workers}): Habana's media loader only supports num_workers={HABANA_NUM_WORKERS}). Pass"
                f" num_workers={HABANA_NUM_WORKERS}."
            )

    def _dataset(self, split: str, dataset: Dataset[Any] | None, folder: str | None, transforms: Any) -> Dataset[Any]:
        """The supplied dataset of this split, or an ImageFolder over its directory under the media loader's rules."""
        if dataset is not None:
            if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
                raise TypeError(
                    f"HPUDataModule({split}_dataset=...) needs a map-style Dataset (with __len__ and __getitem__): its"
                    f" samplers draw indices. Got {type(dataset).__name__}."
                )
            return dataset
        if folder is None:
            raise ValueError(
                f"HPUDataModule has no {split} data: pass {split}_dir=... (an ImageNet folder) or"
                f" {split}_dataset=... (any map-style torch Dataset)."
            )
        if not any(name in str(folder).lower() for name in IMAGENET_NAMES):
            raise ValueError(
                f"HPUDataModule({split}_dir={folder!r}): Habana's media loader only supports the ImageNet dataset, and"
                f" tells it by the directory's name, which must contain one of {IMAGENET_NAMES} (any case). Point"
                f" {split}_dir at your ImageNet copy, or pass {split}_dataset=... to load other data."
            )
        if not self.drop_last:
            raise ValueError(
                "HPUDataModule(drop_last=False): Habana's media loader always drops the last incomplete batch of an"
                " ImageNet folder. Pass drop_last=True (the plugin switched it on with a warning)."
            )
        datasets, transform_lib = _torchvision()
        image_folder: Dataset[Any] = datasets.ImageFolder(folder, self._compose(split, transforms, transform_lib))
        return image_folder

    def _compose(self, split: str, transforms: Any, transform_lib: Any) -> Any:
        allowed_names = TRAIN_TRANSFORMS if split == "train" else VAL_TRANSFORMS
        if transforms is None:
            steps = _default_transforms(split, transform_lib, self.normalize)
        else:
            steps = _as_list(transforms, transform_lib)
        allowed = tuple(getattr(transform_lib, name) for name in allowed_names)
        for step in steps:
            if not isinstance(step, allowed):
                raise ValueError(
                    f"Unsupported {split} transform {type(step).__name__}: Habana's media loader only runs"
                    f" {', '.join(allowed_names)} for {split} data (from torchvision.transforms). Remove it, or pass"
                    f" {split}_dataset=... with your own transforms."
                )
        return transform_lib.Compose(steps)


def _torchvision() -> tuple[Any, Any]:
    """torchvision's datasets and transforms, imported only for image folders: hpu_nb does not depend on it."""
    try:
        from torchvision import datasets, transforms  # noqa: PLC0415 -- lazy: torchvision is optional
    except ImportError as err:
        raise ImportError(
            f"HPUDataModule reads train_dir / val_dir with torchvision.datasets.ImageFolder, and torchvision cannot be"
            f" imported ({err}). `pip install torchvision` (a torchvision built for your torch {torch.__version__}),"
            " or pass train_dataset=... and val_dataset=... (any map-style torch Dataset) instead of the directories."
        ) from err
    return datasets, transforms


def _default_transforms(split: str, transform_lib: Any, normalize: bool) -> list[Any]:
    """Habana's ResNet media pipe defaults as torchvision transforms; with `normalize`, ImageNet's mean/std too."""
    if split == "train":
        steps = [transform_lib.RandomResizedCrop(CROP_SIZE), transform_lib.RandomHorizontalFlip(),
                 transform_lib.ToTensor()]
    else:
        steps = [transform_lib.Resize(VAL_RESIZE), transform_lib.CenterCrop(CROP_SIZE), transform_lib.ToTensor()]
    if normalize:
        steps.append(transform_lib.Normalize(mean=list(IMAGENET_MEAN), std=list(IMAGENET_STD)))
    return steps


def _as_list(transforms: Any, transform_lib: Any) -> list[Any]:
    """The plugin takes a list of transforms; a Compose (its steps) or a single transform are accepted too."""
    if isinstance(transforms, transform_lib.Compose):
        return list(transforms.transforms)
    if isinstance(transforms, Iterable) and not callable(transforms):
        return list(transforms)
    return [transforms]

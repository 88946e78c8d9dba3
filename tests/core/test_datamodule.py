"""HPUDataModule: the media loader's rules on every backend, seeded sampling, and the loader each backend gets.

Modelled behaviour: lightning-habana's HPUDataModule (Habana's media loader on a Gaudi, its rules checked in setup).
"""

from __future__ import annotations

import importlib.util
import sys
import types
import warnings
from typing import Any

import lightning as L
import pytest
import torch
import torch.distributed as dist
from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    TensorDataset,
)

from hpu_nb.core import datamodule
from hpu_nb.core.datamodule import HPUDataModule
from hpu_nb.runtime import get_backend
from tests.fake_habana.fixture import make_fake_gaudi  # noqa: F401
from tests.helpers.models import LinearModel


def numbered(n: int) -> TensorDataset:
    """Sample i is the number i, so a batch shows which samples it holds and in which order."""
    return TensorDataset(torch.arange(n))


def numbers(loader: Any) -> list[list[int]]:
    return [batch[0].tolist() for batch in loader]


def module_on(n_train: int = 10, n_val: int = 10, **kwargs: Any) -> HPUDataModule:
    dm = HPUDataModule(train_dataset=numbered(n_train), val_dataset=numbered(n_val), **kwargs)
    dm.setup("fit")
    return dm


# -- batching and order, on torch's DataLoader (the emulated Gaudi) ---------------------------------------------------
def test_batches_have_the_batch_size_and_drop_last_drops_the_remainder():
    kept = numbers(module_on(batch_size=4, drop_last=True).train_dataloader())
    assert [len(b) for b in kept] == [4, 4]
    assert len({i for b in kept for i in b}) == 8 and set().union(*kept) <= set(range(10))

    everything = numbers(module_on(batch_size=4, drop_last=False).train_dataloader())
    assert [len(b) for b in everything] == [4, 4, 2]
    assert sorted(i for b in everything for i in b) == list(range(10))


def test_training_order_is_random_but_fixed_by_the_seed():
    first = numbers(module_on(n_train=32, batch_size=8, seed=7).train_dataloader())
    again = numbers(module_on(n_train=32, batch_size=8, seed=7).train_dataloader())
    other = numbers(module_on(n_train=32, batch_size=8, seed=8).train_dataloader())
    assert first == again
    assert first != other
    order = [i for b in first for i in b]
    assert sorted(order) == list(range(32)) and order != list(range(32))  # every sample once, shuffled


def test_validation_and_test_data_come_in_order():
    dm = module_on(n_val=10, batch_size=4)
    assert numbers(dm.val_dataloader()) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # drop_last=True: 8 and 9 dropped
    assert numbers(dm.test_dataloader()) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert isinstance(dm.val_dataloader().sampler, SequentialSampler)


def test_distributed_uses_distributed_samplers_seeded_for_training_in_order_for_validation(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        dm = module_on(n_train=16, n_val=8, batch_size=4, seed=3, distributed=True)
        train = dm.train_dataloader()
        assert isinstance(train.sampler, DistributedSampler)
        assert train.sampler.shuffle and train.sampler.seed == 3
        order = [i for b in numbers(train) for i in b]
        assert sorted(order) == list(range(16)) and order != list(range(16))
        val = dm.val_dataloader()
        assert isinstance(val.sampler, DistributedSampler) and not val.sampler.shuffle
        assert numbers(val) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    finally:
        dist.destroy_process_group()


def test_pin_memory_true_does_not_warn_on_the_emulated_gaudi():
    dm = module_on(batch_size=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert numbers(dm.val_dataloader()) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # torch 2.9's DataLoader passes the accelerator to Tensor.pin_memory(device), which torch itself calls deprecated
    # (for every accelerator, CUDA too): that is torch's own, not a word about the emulated card.
    ours = [w for w in caught if "pin_memory" in str(w.message) and "argument 'device' of" not in str(w.message)]
    assert not ours
    assert torch.accelerator.current_accelerator().type == "hpu"  # what torch pins for: the emulated card


def test_loaders_need_setup_and_validate_builds_only_validation_data():
    dm = HPUDataModule(train_dataset=numbered(8), val_dataset=numbered(8), batch_size=4)
    with pytest.raises(RuntimeError, match=r"call setup\('fit'\) first"):
        dm.train_dataloader()
    dm.setup("validate")
    assert dm.dataset_train is None
    assert numbers(dm.val_dataloader()) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(RuntimeError, match="no train data yet"):
        dm.train_dataloader()


# -- the media loader's rules, checked on every backend --------------------------------------------------------------
@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"shuffle": True}, r"^HabanaDataLoader does not support shuffle=True .*\. Pass shuffle=False"),
        ({"pin_memory": False}, r"^HabanaDataLoader only supports pin_memory=True .*\. Pass pin_memory=True"),
        ({"num_workers": 4}, r"^HabanaDataLoader only supports num_workers as 8 .*num_workers=4\).*only supports"
                             r" num_workers=8\)\. Pass num_workers=8"),
        ({"num_workers": 0}, r"Pass num_workers=8"),
    ],
)
def test_each_loader_rule_raises_a_value_error_that_says_what_to_change(arguments, message):
    dm = HPUDataModule(train_dataset=numbered(8), val_dataset=numbered(8), **arguments)
    with pytest.raises(ValueError, match=message):
        dm.setup("fit")


def test_a_split_needs_a_folder_or_a_dataset():
    with pytest.raises(ValueError, match=r"no val data: pass val_dir=\.\.\. .* or val_dataset=\.\.\."):
        HPUDataModule(train_dataset=numbered(8)).setup("fit")


def test_an_iterable_dataset_is_refused_because_samplers_draw_indices():
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(3))

    with pytest.raises(TypeError, match="needs a map-style Dataset"):
        HPUDataModule(train_dataset=Stream(), val_dataset=numbered(8)).setup("fit")


def test_a_folder_not_named_imagenet_is_refused():
    dm = HPUDataModule(train_dir="/data/cats_and_dogs/train", val_dir="/data/imagenet/val")
    with pytest.raises(ValueError, match=r"train_dir='/data/cats_and_dogs/train'.*only supports the ImageNet"):
        dm.setup("fit")


def test_drop_last_false_is_refused_for_image_folders_but_allowed_for_datasets():
    with pytest.raises(ValueError, match=r"drop_last=False.*Pass drop_last=True"):
        HPUDataModule(train_dir="/data/ImageNet/train", val_dir="/data/ImageNet/val", drop_last=False).setup("fit")
    HPUDataModule(train_dataset=numbered(8), val_dataset=numbered(8), drop_last=False).setup("fit")


def test_without_torchvision_image_folders_raise_an_import_error_naming_pip_install(monkeypatch):
    if importlib.util.find_spec("torchvision") is not None:  # not on this machine; elsewhere, hide it
        monkeypatch.setitem(sys.modules, "torchvision", None)
    dm = HPUDataModule(train_dir="/data/ILSVRC2012/train", val_dir="/data/ILSVRC2012/val")
    with pytest.raises(ImportError, match=r"`pip install torchvision` \(a torchvision built for your torch"):
        dm.setup("fit")


# -- image folders, through a stand-in torchvision (the real one cannot be installed beside this torch) --------------
class _Transform:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs

    def __call__(self, image: Any) -> Any:
        return image


TRANSFORM_NAMES = ("RandomResizedCrop", "RandomHorizontalFlip", "ToTensor", "Normalize", "Resize", "CenterCrop",
                   "ColorJitter")


@pytest.fixture
def torchvision(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """torchvision's names that HPUDataModule uses: transform classes, Compose and an ImageFolder that records."""
    transforms = types.ModuleType("torchvision.transforms")
    for name in TRANSFORM_NAMES:
        setattr(transforms, name, type(name, (_Transform,), {}))

    class Compose(_Transform):
        def __init__(self, steps: list[Any]) -> None:
            self.transforms = list(steps)

    class ImageFolder(Dataset):
        def __init__(self, root: str, transform: Any = None) -> None:
            self.root, self.transform = root, transform

        def __len__(self) -> int:
            return 10

        def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
            return torch.full((3,), float(index)), index % 2

    transforms.Compose = Compose
    datasets = types.ModuleType("torchvision.datasets")
    datasets.ImageFolder = ImageFolder
    module = types.ModuleType("torchvision")
    module.transforms, module.datasets = transforms, datasets
    for name, value in (("torchvision", module), ("torchvision.transforms", transforms),
                        ("torchvision.datasets", datasets)):
        monkeypatch.setitem(sys.modules, name, value)
    return module


def steps_of(dataset: Any) -> list[tuple[str, tuple, dict]]:
    return [(type(t).__name__, t.args, t.kwargs) for t in dataset.transform.transforms]


def test_image_folders_get_the_media_pipe_defaults_and_normalize_adds_imagenet_statistics(torchvision):
    dm = HPUDataModule(train_dir="/data/imagenet/train", val_dir="/data/imagenet/val")
    dm.setup("fit")
    assert isinstance(dm.dataset_train, torchvision.datasets.ImageFolder)
    assert (dm.dataset_train.root, dm.dataset_val.root) == ("/data/imagenet/train", "/data/imagenet/val")
    assert steps_of(dm.dataset_train) == [("RandomResizedCrop", (224,), {}), ("RandomHorizontalFlip", (), {}),
                                          ("ToTensor", (), {})]
    assert steps_of(dm.dataset_val) == [("Resize", (256,), {}), ("CenterCrop", (224,), {}), ("ToTensor", (), {})]

    dm = HPUDataModule(train_dir="/data/imagenet/train", val_dir="/data/imagenet/val", normalize=True)
    dm.setup("fit")
    statistics = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
    for dataset in (dm.dataset_train, dm.dataset_val):
        assert steps_of(dataset)[-1] == ("Normalize", (), statistics)
        assert len(steps_of(dataset)) == 4


def test_supported_transforms_are_composed_in_order_and_normalize_leaves_them_alone(torchvision):
    t = torchvision.transforms
    train = [t.RandomResizedCrop(160), t.ToTensor()]
    val = t.Compose([t.Resize(180), t.CenterCrop(160), t.ToTensor()])
    dm = HPUDataModule(train_dir="/x/IMAGENET/train", val_dir="/x/IMAGENET/val", train_transforms=train,
                       val_transforms=val, normalize=True, batch_size=8)
    dm.setup("fit")
    assert steps_of(dm.dataset_train) == [("RandomResizedCrop", (160,), {}), ("ToTensor", (), {})]
    assert steps_of(dm.dataset_val) == [("Resize", (180,), {}), ("CenterCrop", (160,), {}), ("ToTensor", (), {})]
    assert [len(b) for b in numbers(dm.train_dataloader())] == [8]  # 10 images, batch 8, last one dropped


@pytest.mark.parametrize(
    ("split", "step", "allowed"),
    [
        ("train", "ColorJitter", "RandomResizedCrop, RandomHorizontalFlip, ToTensor, Normalize"),
        ("train", "CenterCrop", "RandomResizedCrop, RandomHorizontalFlip, ToTensor, Normalize"),
        ("val", "RandomHorizontalFlip", "Resize, CenterCrop, ToTensor, Normalize"),
    ],
)
def test_a_transform_the_media_loader_cannot_run_is_refused(torchvision, split, step, allowed):
    t = torchvision.transforms
    dm = HPUDataModule(train_dir="/data/imagenet/train", val_dir="/data/imagenet/val",
                       **{f"{split}_transforms": [t.ToTensor(), getattr(t, step)()]})
    with pytest.raises(ValueError, match=rf"Unsupported {split} transform {step}: .* only runs {allowed} for {split}"):
        dm.setup("fit")


def test_a_supplied_dataset_skips_the_folder_rules_for_its_split_only(torchvision):
    t = torchvision.transforms
    dm = HPUDataModule(train_dataset=numbered(8), val_dir="/data/imagenet/val", train_transforms=[t.ColorJitter()])
    dm.setup("fit")  # ColorJitter is never applied: the supplied train set brings its own transforms
    assert isinstance(dm.dataset_val, torchvision.datasets.ImageFolder)
    dm = HPUDataModule(train_dataset=numbered(8), val_dir="/data/cats/val")
    with pytest.raises(ValueError, match="val_dir='/data/cats/val'"):
        dm.setup("fit")


# -- which loader each backend gets -----------------------------------------------------------------------------------
def fake_habana_dataloader() -> types.ModuleType:
    """`habana_dataloader` whose HabanaDataLoader records the keywords it was built with."""
    module = types.ModuleType("habana_dataloader")

    class HabanaDataLoader:
        built: list[dict[str, Any]] = []

        def __init__(self, **arguments: Any) -> None:
            HabanaDataLoader.built.append(arguments)
            self.arguments = arguments

    module.HabanaDataLoader = HabanaDataLoader
    return module


def expected_arguments(dm: HPUDataModule, dataset: Dataset, ordered: bool = True) -> dict[str, Any]:
    """ordered=False (training): no `shuffle` keyword, so Habana's media loader shuffles (it ignores samplers)."""
    ordering = {"shuffle": False} if ordered else {}
    return {"dataset": dataset, "batch_size": dm.batch_size, **ordering, "num_workers": 8, "pin_memory": True,
            "drop_last": dm.drop_last}


def test_the_emulated_gaudi_uses_torchs_dataloader_with_the_same_arguments(monkeypatch):
    monkeypatch.setitem(sys.modules, "habana_dataloader", fake_habana_dataloader())  # present, and still not used
    dm = module_on(batch_size=4, drop_last=False)
    assert get_backend().is_emulated
    loader = dm.train_dataloader()
    assert type(loader) is DataLoader
    got = {name: getattr(loader, name) for name in ("dataset", "batch_size", "num_workers", "pin_memory",
                                                     "drop_last")}
    assert got == {k: v for k, v in expected_arguments(dm, dm.train_dataset).items() if k != "shuffle"}
    assert isinstance(loader.sampler, RandomSampler)  # torch refuses shuffle=True beside a sampler: it was False
    assert sys.modules["habana_dataloader"].HabanaDataLoader.built == []


def test_on_a_gaudi_habanas_media_loader_gets_the_same_arguments(make_fake_gaudi, monkeypatch):  # noqa: F811
    make_fake_gaudi()
    assert not get_backend().is_emulated
    habana_dataloader = fake_habana_dataloader()
    monkeypatch.setitem(sys.modules, "habana_dataloader", habana_dataloader)
    dm = module_on(batch_size=4, seed=5)
    assert dm.loader_class is habana_dataloader.HabanaDataLoader

    train = dm.train_dataloader()
    assert isinstance(train, habana_dataloader.HabanaDataLoader)
    sampler = train.arguments.pop("sampler")
    assert train.arguments == expected_arguments(dm, dm.train_dataset, ordered=False)
    assert isinstance(sampler, RandomSampler) and sampler.generator.initial_seed() == 5

    val = dm.val_dataloader()
    assert isinstance(val.arguments.pop("sampler"), SequentialSampler)
    assert val.arguments == expected_arguments(dm, dm.val_dataset)
    assert len(habana_dataloader.HabanaDataLoader.built) == 2


def test_on_a_gaudi_without_habana_dataloader_setup_raises_a_clear_import_error(make_fake_gaudi,  # noqa: F811
                                                                                monkeypatch):
    make_fake_gaudi()
    monkeypatch.setitem(sys.modules, "habana_dataloader", None)
    dm = HPUDataModule(train_dataset=numbered(8), val_dataset=numbered(8))
    with pytest.raises(ImportError, match=r"Habana's media loader on a Gaudi, and `habana_dataloader` cannot be"):
        dm.setup("fit")


def test_the_loader_choice_is_one_function_of_the_backend(monkeypatch):
    monkeypatch.setitem(sys.modules, "habana_dataloader", None)
    assert datamodule.habana_or_torch_loader() is DataLoader  # emulated: never looks for habana_dataloader


# -- the public name and a Trainer ------------------------------------------------------------------------------------
def test_hpu_nb_exports_it():
    import hpu_nb

    assert hpu_nb.HPUDataModule is HPUDataModule
    assert "HPUDataModule" in dir(hpu_nb)
    assert issubclass(HPUDataModule, L.LightningDataModule)


def test_a_trainer_on_hpu_fits_a_model_on_it():
    gen = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(40, 8, generator=gen), torch.randn(40, 8, generator=gen))
    dm = HPUDataModule(batch_size=8, train_dataset=data, val_dataset=data)
    model = LinearModel(features=8, lr=0.1)
    before = model.layer.weight.detach().clone()
    trainer = L.Trainer(accelerator="hpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, datamodule=dm)
    assert trainer.strategy.root_device.type == "hpu"
    assert trainer.global_step == 2 and len(model.seen_dtypes) == 2
    assert not torch.equal(model.layer.weight.detach().cpu(), before)
    assert isinstance(trainer.train_dataloader.sampler, RandomSampler)  # ours, not replaced by Lightning

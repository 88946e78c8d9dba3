"""Tiny random stand-ins for the data and hub models Habana's Gaudi-tutorials notebooks download.

Used only by tools/run_gaudi_tutorials.py (see sitecustomize.py beside it). Data sets keep their API (arguments,
item types, class lists) with content made to be learnable: each item's label is a fixed, simple function of its image
or text (`label_of_image`, `label_of_text`), so a model that trains on `hpu` lowers its loss, and one whose training
is broken (wrong gradients, a step that does nothing) does not. Hub models are the named architecture built from a
tiny config (random weights) with a small word-level tokenizer; a name that is a local directory (a model the
notebook saved) loads for real.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np

# -- images -----------------------------------------------------------------------------------------------------------


_NOISE = 48  # pixel noise (+-) around an RGB image's class colour
_GREY_NOISE = 32  # a greyscale image's dark background, 0 to this: sparse, as MNIST's digits are (with a brighter one,
# Lightning's hello-world model, relu on its logits at Adam's lr 0.02, sometimes dies at the log of the class count)


def _palette(classes: int) -> np.ndarray:
    """One RGB colour per class, spread over a 5x5x5 grid of levels (125 colours: enough for Flowers102)."""
    levels = np.array([0, 64, 128, 192, 255])
    grid = np.array([(levels[i // 25], levels[(i // 5) % 5], levels[i % 5]) for i in range(125)])
    return grid[[i * 125 // classes for i in range(classes)]]


def class_image(label: int, classes: int, height: int, width: int, mode: str, rng: np.random.Generator) -> Any:
    """An image whose class is plain to see, with noise: RGB images are tinted with the class's colour (what survives
    crops, flips and resizing: the GPU-migration script trains on RandomResizedCrop), greyscale ones have a bright
    horizontal band in the class's tenth of the height (what a linear layer on MNIST learns in a few steps)."""
    from PIL import Image

    if mode == "L":
        pixels = rng.integers(0, _GREY_NOISE + 1, (height, width)).astype(np.int64)
        band = label % 10
        pixels[band * height // 10:(band + 1) * height // 10] += 255 - _GREY_NOISE
    else:
        pixels = _palette(classes)[label][None, None, :] + rng.integers(-_NOISE, _NOISE + 1, (height, width, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), mode)


def label_of_image(image: Any, classes: int) -> int:
    """The label `class_image` gave this image (a PIL image or an array): the brightest band, or the nearest colour."""
    pixels = np.asarray(image, dtype=np.float64)
    if pixels.ndim == 2:
        height = pixels.shape[0]
        bands = [pixels[k * height // 10:(k + 1) * height // 10].mean() for k in range(10)]
        return int(np.argmax(bands))
    distances = ((_palette(classes) - pixels.reshape(-1, 3).mean(axis=0)) ** 2).sum(axis=1)
    return int(np.argmin(distances))


def _class_image_dataset(name: str, length: int, size: tuple[int, int] | None, mode: str, classes: list[str],
                         test_length: int | None = None) -> type:
    import torch.utils.data

    class Dataset(torch.utils.data.Dataset):
        def __init__(self, root: Any = None, train: bool = True, transform: Any = None, target_transform: Any = None,
                     download: bool = False, split: str = "train", **kwargs: Any) -> None:
            self.root, self.train, self.transform, self.target_transform = root, train, transform, target_transform
            self.classes = list(classes)
            self.class_to_idx = {c: i for i, c in enumerate(classes)}
            is_train = train and split == "train"
            self._length = length if is_train else (test_length or max(length // 5, 16))
            self._seed = 0 if is_train else 1

        def __len__(self) -> int:
            return self._length

        def __getitem__(self, index: int) -> tuple[Any, Any]:
            if not 0 <= index < self._length:
                raise IndexError(index)
            rng = np.random.default_rng(self._seed * 10_000_019 + index)
            height, width = size if size is not None else (int(rng.integers(48, 97)), int(rng.integers(48, 97)))
            target: Any = int(rng.integers(len(classes)))
            image: Any = class_image(target, len(classes), height, width, mode, rng)
            if self.transform is not None:
                image = self.transform(image)
            if self.target_transform is not None:
                target = self.target_transform(target)
            return image, target

    Dataset.__name__ = Dataset.__qualname__ = name
    Dataset.__doc__ = (f"torchvision.datasets.{name}, stood in for: {length} generated images whose label is "
                       "plain in the image (tutorial_standins.label_of_image), nothing downloaded.")
    return Dataset


# The stand-ins' sizes where they differ from the real data set's: the runner lists them as edits of the notebooks
# that load these data sets (train images / test images).
SIZE_CUTS = {
    "CIFAR10": "CIFAR10 stand-in: 50,000 / 10,000 images -> 2,000 / 400",
    "Flowers102": "Flowers102 stand-in: 1,020 train images -> 70",
}


def patch_torchvision_datasets(module: Any) -> None:
    digits = ["0 - zero", "1 - one", "2 - two", "3 - three", "4 - four", "5 - five", "6 - six", "7 - seven",
              "8 - eight", "9 - nine"]
    # MNIST keeps its real length: notebooks split it by count (random_split(mnist, [55000, 5000])).
    module.MNIST = _class_image_dataset("MNIST", 60_000, (28, 28), "L", digits, test_length=10_000)
    module.FashionMNIST = _class_image_dataset("FashionMNIST", 60_000, (28, 28), "L", [str(i) for i in range(10)],
                                               test_length=10_000)
    module.CIFAR10 = _class_image_dataset(
        "CIFAR10", 4_000, (32, 32), "RGB",
        ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"], test_length=400)
    # Flowers102's images differ in size (what the dynamic-shapes tutorial is about): so do these.
    module.Flowers102 = _class_image_dataset("Flowers102", 70, None, "RGB", [str(i) for i in range(102)])


def write_image_folder(root: str, classes: int = 10, per_class: int = 8, size: int = 64) -> None:
    """An ImageFolder tree (train/ and val/) of JPEGs tinted by class (`class_image`), for a script that reads a data
    set from disk."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for label in range(classes):
            folder = os.path.join(root, split, f"n{label:08d}")
            os.makedirs(folder, exist_ok=True)
            for i in range(per_class):
                image = class_image(label, classes, size, size, "RGB", rng)
                image.save(os.path.join(folder, f"{split}_{label}_{i}.JPEG"), quality=95)


def write_mnist_checkpoint(path: str, steps: int = 60) -> list[float]:
    """Habana's inference tutorials download a trained MNIST MLP (784-256-64-10, mnist-epoch_20.pth): this trains one
    of the same shapes on the CPU, on the MNIST stand-in, so the accuracy the notebook then measures on `hpu` says
    whether inference there is right (~100% here, 10% for a broken one). Returns the training losses."""
    import torch
    import torch.nn.functional as F
    from torchvision import datasets, transforms

    torch.manual_seed(0)
    data = datasets.MNIST(".", train=True, transform=transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))]))
    layers = torch.nn.ModuleDict({"fc1": torch.nn.Linear(784, 256), "fc2": torch.nn.Linear(256, 64),
                                  "fc3": torch.nn.Linear(64, 10)})
    optimizer = torch.optim.Adam(layers.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(data, batch_size=32, shuffle=True)
    losses = []
    for step, (x, y) in enumerate(loader):
        if step == steps:
            break
        out = F.relu(layers["fc1"](x.view(-1, 784)))
        out = F.log_softmax(layers["fc3"](F.relu(layers["fc2"](out))), dim=1)
        loss = F.nll_loss(out, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    torch.save({f"{name}.{p}": t for name, layer in layers.items() for p, t in layer.state_dict().items()}, path)
    return losses


# -- text -------------------------------------------------------------------------------------------------------------
_WORD_TEXT = (
    "the of and to in is was for on that with as by at from his her it an were are which this be or has "
    "had not but first one their its new after who they have two been other when there all during into "
    "school time may years more most only over city some world would where later up such used many can "
    "state about national out known university united then made year three people team season game "
    "between under both while since film band album song river house water light dog cat bird tree book "
    "story music line day night long small large old young good great high low left right north south "
    "east west war early end part part life work home place name number group family system government "
    "company area land sea road"
)
_WORDS = _WORD_TEXT.split()
_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<|endoftext|>"]


def random_sentence(rng: np.random.Generator, low: int = 4, high: int = 40) -> str:
    words = [w for w in rng.choice(_WORDS, size=int(rng.integers(low, high + 1))) if w not in _MARKERS] or ["the"]
    return " ".join(words).capitalize() + "."


def _tokenizer(kind: str) -> Any:
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate([*_SPECIAL, *dict.fromkeys(_WORDS), ".", ",", "?", "!"])}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()  # words joined by spaces
    if kind in ("gpt2", "llama"):
        return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<|endoftext|>",
                                       eos_token="<|endoftext|>", unk_token="[UNK]", model_max_length=512,
                                       model_input_names=["input_ids", "attention_mask"])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]", model_max_length=512,
                                   model_input_names=["input_ids", "token_type_ids", "attention_mask"])


_KINDS = (("distilbert", "distilbert"), ("albert", "albert"), ("roberta", "roberta"), ("bert", "bert"),
          ("gpt2", "gpt2"), ("llama", "llama"), ("t5", "t5"), ("vit", "vit"))
_TINY: dict[str, dict[str, Any]] = {
    "bert": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64},
    "roberta": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64},
    "distilbert": {"dim": 32, "hidden_dim": 64, "n_layers": 2, "n_heads": 2},
    "albert": {"embedding_size": 16, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
               "intermediate_size": 64},
    "gpt2": {"n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 512},
    "llama": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
              "intermediate_size": 64},
    "t5": {"d_model": 32, "d_ff": 64, "num_layers": 2, "num_heads": 2, "d_kv": 16},
    "vit": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
            "image_size": 384, "patch_size": 32},
}
_HUB_ONLY = {"trust_remote_code", "revision", "token", "cache_dir", "use_auth_token", "code_revision",
             "local_files_only", "force_download", "proxies", "subfolder", "use_fast", "return_unused_kwargs",
             "torch_dtype", "dtype", "device_map", "low_cpu_mem_usage", "attn_implementation", "config"}


def _kind(name: Any) -> str | None:
    if not isinstance(name, str) or os.path.isdir(name):
        return None  # a local directory: the notebook's own saved model, loaded for real
    lowered = name.lower()
    return next((kind for key, kind in _KINDS if key in lowered), None)


def _config(kind: str, **kwargs: Any) -> Any:
    from transformers import AutoConfig

    settings = {**_TINY[kind], "vocab_size": len(_tokenizer(kind)), "pad_token_id": 0}
    settings.update({k: v for k, v in kwargs.items() if k not in _HUB_ONLY and not k.startswith("_")})
    return AutoConfig.for_model(kind, **settings)


def patch_transformers(module: Any) -> None:
    from transformers import AutoConfig, AutoTokenizer, PreTrainedModel
    from transformers.models.auto import auto_factory

    config_from_pretrained = AutoConfig.from_pretrained.__func__
    tokenizer_from_pretrained = AutoTokenizer.from_pretrained.__func__
    auto_from_pretrained = auto_factory._BaseAutoModelClass.from_pretrained.__func__
    model_from_pretrained = PreTrainedModel.from_pretrained.__func__

    @functools.wraps(config_from_pretrained)
    def config(cls: Any, name: Any, *args: Any, **kwargs: Any) -> Any:
        kind = _kind(name)
        if kind is None:
            return config_from_pretrained(cls, name, *args, **kwargs)
        made = _config(kind, **kwargs)
        return (made, {}) if kwargs.get("return_unused_kwargs") else made

    @functools.wraps(tokenizer_from_pretrained)
    def tokenizer(cls: Any, name: Any, *args: Any, **kwargs: Any) -> Any:
        kind = _kind(name)
        return tokenizer_from_pretrained(cls, name, *args, **kwargs) if kind is None else _tokenizer(kind)

    def _model(cls: Any, name: Any, original: Any, *args: Any, **kwargs: Any) -> Any:
        kind = _kind(name)
        if kind is None:
            return original(cls, name, *args, **kwargs)
        made = kwargs.get("config") or _config(kind, **kwargs)
        model = cls.from_config(made) if hasattr(cls, "from_config") else cls(made)
        dtype = kwargs.get("torch_dtype") or kwargs.get("dtype")
        if dtype not in (None, "auto"):
            model = model.to(dtype)
        return model.eval()

    AutoConfig.from_pretrained = classmethod(config)
    AutoTokenizer.from_pretrained = classmethod(tokenizer)
    auto_factory._BaseAutoModelClass.from_pretrained = classmethod(
        lambda cls, name, *a, **k: _model(cls, name, auto_from_pretrained, *a, **k))
    PreTrainedModel.from_pretrained = classmethod(
        lambda cls, name, *a, **k: _model(cls, name, model_from_pretrained, *a, **k))


_GLUE_FIELDS = {"cola": ["sentence"], "sst2": ["sentence"], "mrpc": ["sentence1", "sentence2"],
                "qqp": ["question1", "question2"], "stsb": ["sentence1", "sentence2"],
                "mnli": ["premise", "hypothesis"],
                "qnli": ["question", "sentence"], "rte": ["sentence1", "sentence2"], "wnli": ["sentence1", "sentence2"]}
_GLUE_LABELS = {"stsb": 1, "mnli": 3}
# A GLUE stand-in's label is written into its first text: class k's marker word, once (stsb, a score from 0 to 5: the
# first marker word that many times). The sentences around it never use a marker word.
_MARKERS = ("north", "south", "east")


def label_of_text(text: str, labels: int) -> float:
    """The label of a GLUE stand-in row, read from its first text (`labels` 1: stsb's score, a float)."""
    words = [w.strip(".,").lower() for w in text.split()]
    if labels == 1:
        return float(words.count(_MARKERS[0]))
    return next(k for k, marker in enumerate(_MARKERS[:labels]) if marker in words)


def _marked_sentence(rng: np.random.Generator, marker: str, times: int) -> str:
    words = [w for w in rng.choice(_WORDS, size=int(rng.integers(4, 30))) if w not in _MARKERS]
    for _ in range(times):
        words.insert(int(rng.integers(0, len(words) + 1)), marker)
    return " ".join(words).capitalize() + "."


def _glue(task: str) -> Any:
    import datasets

    rng = np.random.default_rng(0)
    splits = ["train", "validation_matched", "validation_mismatched"] if task == "mnli" else ["train", "validation"]
    labels = _GLUE_LABELS.get(task, 2)
    out = {}
    for split in splits:
        n = 64 if split == "train" else 32
        first, *others = _GLUE_FIELDS[task]
        targets = [int(rng.integers(6 if labels == 1 else labels)) for _ in range(n)]
        rows: dict[str, list[Any]] = {
            first: [_marked_sentence(rng, _MARKERS[0], t) if labels == 1 else _marked_sentence(rng, _MARKERS[t], 1)
                    for t in targets]}
        rows.update({field: [random_sentence(rng) for _ in range(n)] for field in others})
        rows["label"] = [float(t) if labels == 1 else t for t in targets]
        rows["idx"] = list(range(n))
        out[split] = datasets.Dataset.from_dict(rows)
    return datasets.DatasetDict(out)


def _squad() -> Any:
    import datasets

    rng = np.random.default_rng(1)
    out = {}
    for split, n in (("train", 70), ("validation", 21)):
        contexts = [" ".join(random_sentence(rng) for _ in range(int(rng.integers(1, 6)))) for _ in range(n)]
        out[split] = datasets.Dataset.from_dict({
            "id": [f"{split}{i}" for i in range(n)], "title": ["stand-in"] * n, "context": contexts,
            "question": [random_sentence(rng, 3, 10) for _ in range(n)],
            "answers": [{"text": [c.split()[0]], "answer_start": [0]} for c in contexts]})
    return datasets.DatasetDict(out)


def patch_datasets(module: Any) -> None:
    original = module.load_dataset

    @functools.wraps(original)
    def load_dataset(path: str, name: str | None = None, *args: Any, **kwargs: Any) -> Any:
        if path in ("glue", "nyu-mll/glue") and name in _GLUE_FIELDS:
            return _glue(name)
        if path in ("squad", "rajpurkar/squad"):
            return _squad()
        return original(path, name, *args, **kwargs)

    module.load_dataset = load_dataset


# -- probes: what the runner's report reads ---------------------------------------------------------------------------
def _probe_file(kind: str) -> str | None:
    folder = os.environ.get("GAUDI_TUTORIALS_PROBE_DIR")
    return os.path.join(folder, f"{kind}-{os.getpid()}.jsonl") if folder else None


def _probe_append(kind: str, record: dict[str, Any]) -> None:
    import json

    path = _probe_file(kind)
    if path is not None:
        with open(path, "a") as out:
            out.write(json.dumps(record) + "\n")


_device_use_written = False


def probe_write_device_use() -> None:
    """How many allocations this process made on the emulated `hpu` card (none if the card never loaded), once: at
    exit, or for a notebook kernel (whose shutdown skips exit handlers) from the runner's last cell. The card's own
    counter (NumAllocs), so a notebook that moves nothing to `hpu` reads 0 whatever it imports."""
    import sys

    global _device_use_written
    if _device_use_written:
        return
    _device_use_written = True

    device = sys.modules.get("hpu_nb.emulator.hpu_device")
    allocations = 0
    if device is not None and device.is_loaded():
        try:
            allocations = int(device.memory_stats()["NumAllocs"])
        except Exception:  # a card torn down with its process: nothing to read
            allocations = 0
    _probe_append("device", {"argv": sys.argv[:2], "hpu_allocations": allocations})


def patch_lightning(module: Any) -> None:
    """Every Trainer gets a callback that records each training step's loss (value, device) for the runner: Habana's
    Lightning notebooks return the loss from training_step without printing it."""
    import importlib
    import itertools

    fits = itertools.count()
    package = module.__name__.removesuffix(".trainer.trainer")  # lightning.pytorch or pytorch_lightning
    callback: Any = importlib.import_module(f"{package}.callbacks").Callback

    class _LossRecorder(callback):  # type: ignore[misc, valid-type]
        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self.fit = f"{os.getpid()}-{next(fits)}"

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            if loss is not None and hasattr(loss, "device"):
                _probe_append("losses", {"fit": getattr(self, "fit", "?"), "loss": float(loss.detach().float()),
                                         "device": loss.device.type})

    original = module.Trainer.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        given = kwargs.get("callbacks")
        callbacks = list(given) if isinstance(given, (list, tuple)) else [] if given is None else [given]
        kwargs["callbacks"] = [*callbacks, _LossRecorder()]
        original(self, *args, **kwargs)

    module.Trainer.__init__ = __init__

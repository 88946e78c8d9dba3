"""Tiny random stand-ins for the data and hub models Habana's Gaudi-tutorials notebooks download.

Used only by tools/run_gaudi_tutorials.py (see sitecustomize.py beside it). Data sets keep their API (arguments,
item types, class lists) with random content; hub models are the named architecture built from a tiny config (random
weights) with a small word-level tokenizer. A name that is a local directory (a model the notebook saved) loads for
real. Numbers the notebooks print (accuracy, loss) are therefore meaningless: what is checked is that the Gaudi code
runs.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np

# -- images -----------------------------------------------------------------------------------------------------------


def _random_image_dataset(name: str, length: int, size: tuple[int, int] | None, mode: str, classes: list[str]) -> type:
    import torch.utils.data
    from PIL import Image

    class Dataset(torch.utils.data.Dataset):
        def __init__(self, root: Any = None, train: bool = True, transform: Any = None, target_transform: Any = None,
                     download: bool = False, split: str = "train", **kwargs: Any) -> None:
            self.root, self.train, self.transform, self.target_transform = root, train, transform, target_transform
            self.classes = list(classes)
            self.class_to_idx = {c: i for i, c in enumerate(classes)}
            self._length = length if (train and split == "train") else max(length // 5, 16)
            self._seed = 0 if (train and split == "train") else 1

        def __len__(self) -> int:
            return self._length

        def __getitem__(self, index: int) -> tuple[Any, Any]:
            if not 0 <= index < self._length:
                raise IndexError(index)
            rng = np.random.default_rng(self._seed * 10_000_019 + index)
            height, width = size if size is not None else (int(rng.integers(48, 97)), int(rng.integers(48, 97)))
            shape = (height, width) if mode == "L" else (height, width, 3)
            image: Any = Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode)
            target: Any = int(rng.integers(len(classes)))
            if self.transform is not None:
                image = self.transform(image)
            if self.target_transform is not None:
                target = self.target_transform(target)
            return image, target

    Dataset.__name__ = Dataset.__qualname__ = name
    Dataset.__doc__ = f"torchvision.datasets.{name}, stood in for: {length} random images, nothing downloaded."
    return Dataset


def patch_torchvision_datasets(module: Any) -> None:
    digits = ["0 - zero", "1 - one", "2 - two", "3 - three", "4 - four", "5 - five", "6 - six", "7 - seven",
              "8 - eight", "9 - nine"]
    # MNIST keeps its real length: notebooks split it by count (random_split(mnist, [55000, 5000])).
    module.MNIST = _random_image_dataset("MNIST", 60_000, (28, 28), "L", digits)
    module.FashionMNIST = _random_image_dataset("FashionMNIST", 60_000, (28, 28), "L", [str(i) for i in range(10)])
    module.CIFAR10 = _random_image_dataset(
        "CIFAR10", 400, (32, 32), "RGB",
        ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"])
    # Flowers102's images differ in size (what the dynamic-shapes tutorial is about): so do these.
    module.Flowers102 = _random_image_dataset("Flowers102", 70, None, "RGB", [str(i) for i in range(102)])


def write_image_folder(root: str, classes: int = 10, per_class: int = 2, size: int = 64) -> None:
    """An ImageFolder tree (train/ and val/) of random JPEGs, for a script that reads a data set from disk."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for label in range(classes):
            folder = os.path.join(root, split, f"n{label:08d}")
            os.makedirs(folder, exist_ok=True)
            for i in range(per_class):
                pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
                Image.fromarray(pixels, "RGB").save(os.path.join(folder, f"{split}_{label}_{i}.JPEG"))


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
    words = rng.choice(_WORDS, size=int(rng.integers(low, high + 1)))
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


def _glue(task: str) -> Any:
    import datasets

    rng = np.random.default_rng(0)
    splits = ["train", "validation_matched", "validation_mismatched"] if task == "mnli" else ["train", "validation"]
    out = {}
    for split in splits:
        n = 64 if split == "train" else 32
        rows: dict[str, list[Any]] = {field: [random_sentence(rng) for _ in range(n)] for field in _GLUE_FIELDS[task]}
        labels = _GLUE_LABELS.get(task, 2)
        rows["label"] = [float(rng.random() * 5) if labels == 1 else int(rng.integers(labels)) for _ in range(n)]
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

"""Hugging Face optimum-habana's GaudiTrainer on tiny models, as a user of optimum-habana writes it.

Each model (Llama, GPT-2: causal LM; BERT: sequence classification) is built from its config with random weights and
trained on random token ids (no download, no tokenizer), with `use_habana=True`, the mode from the command line
(`lazy` / `eager`, matching PT_HPU_LAZY_MODE as optimum-habana requires), bf16 autocast, and the Gaudi options that
call Habana's kernels: fused AdamW and fused gradient-norm clipping (GaudiConfig). `llama_fp8` trains the Llama with
`fp8=True` (Habana's transformer engine, through accelerate). Nothing here knows about hpu_nb.
Usage: `optimum_train.py lazy llama gpt2 bert llama_fp8`. Prints one JSON line, per model: the logged losses, the
optimizer and clip-norm classes the trainer used and how often each ran, the model class and device, the dtype its
first linear layer computed in, and the mark_steps placed (counted by the emulated Gaudi in lazy mode).
"""

from __future__ import annotations

import json
import sys
import tempfile
from typing import Any, Callable

import habana_frameworks.torch.core as htcore
import torch
from habana_frameworks.torch.hpex.normalization import FusedClipNorm
from optimum.habana import GaudiConfig, GaudiTrainer, GaudiTrainingArguments
from torch.optim.optimizer import register_optimizer_step_post_hook
from transformers import (AutoModelForCausalLM, AutoModelForSequenceClassification, BertConfig, GPT2Config,
                          LlamaConfig, PreTrainedModel)

VOCAB = 64
STEPS = 20


def token_ids(sequences: int = 8, length: int = 16) -> torch.Tensor:
    return torch.randint(0, VOCAB, (sequences, length), generator=torch.Generator().manual_seed(0))


def causal_lm_dataset() -> list[dict[str, torch.Tensor]]:
    """A few random sequences to memorise: labels = input ids."""
    return [{"input_ids": row, "attention_mask": torch.ones_like(row), "labels": row.clone()} for row in token_ids()]


def classification_dataset() -> list[dict[str, torch.Tensor]]:
    """Random sequences labelled by the parity of their first token."""
    return [{"input_ids": row, "attention_mask": torch.ones_like(row), "labels": row[0] % 2} for row in token_ids()]


def llama() -> PreTrainedModel:
    return AutoModelForCausalLM.from_config(LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64))


def gpt2() -> PreTrainedModel:
    return AutoModelForCausalLM.from_config(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4,
                                                       n_positions=64))


def bert() -> PreTrainedModel:
    return AutoModelForSequenceClassification.from_config(BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, num_labels=2))


MODELS: dict[str, tuple[Callable[[], PreTrainedModel], Callable[[], list[dict[str, torch.Tensor]]]]] = {
    "llama": (llama, causal_lm_dataset), "gpt2": (gpt2, causal_lm_dataset), "bert": (bert, classification_dataset),
    "llama_fp8": (llama, causal_lm_dataset),
}


def qualified(obj: object) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def count_calls(cls: type, method: str) -> list[None]:
    """Count the calls of cls.method from now on (it still runs as before)."""
    calls: list[None] = []
    original = getattr(cls, method)

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(None)
        return original(*args, **kwargs)

    setattr(cls, method, counted)
    return calls


stepped: list[str] = []  # torch's global hook sees every optimizer.step(), whoever calls it
register_optimizer_step_post_hook(lambda optimizer, *_: stepped.append(qualified(optimizer)))
clipped = count_calls(FusedClipNorm, "clip_norm")


def train(name: str, mode: str) -> dict[str, Any]:
    # The arguments first: with use_habana they adapt transformers to Gaudi before any model is built.
    args = GaudiTrainingArguments(
        output_dir=tempfile.mkdtemp(), use_habana=True, use_lazy_mode=mode == "lazy", bf16=True, max_grad_norm=1.0,
        per_device_train_batch_size=4, max_steps=STEPS, learning_rate=5e-3, logging_steps=1, save_strategy="no",
        report_to=[], seed=0, dataloader_num_workers=0, fp8=name.endswith("_fp8"),
    )
    gaudi_config = GaudiConfig(use_fused_adam=True, use_fused_clip_norm=True, use_torch_autocast=True)
    build, dataset = MODELS[name]
    torch.manual_seed(0)
    model = build()
    computed_in: list[str] = []
    first_linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    first_linear.register_forward_hook(lambda m, i, out: computed_in.append(str(out.dtype)))
    stepped.clear()
    clipped.clear()
    marked_before = htcore.placed_mark_steps if hasattr(htcore, "placed_mark_steps") else 0
    trainer = GaudiTrainer(model=model, args=args, gaudi_config=gaudi_config, train_dataset=dataset())
    trainer.train()
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # accelerate wraps it
    result = {
        "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
        "optimizer": qualified(optimizer),
        "clip_norm": qualified(trainer.FusedNorm),
        "steps_by": {step: stepped.count(step) for step in set(stepped)},
        "clip_norm_calls": len(clipped),
        "mark_steps": (htcore.placed_mark_steps - marked_before) if hasattr(htcore, "placed_mark_steps") else None,
        "device": str(next(model.parameters()).device),
        "model_class": qualified(model),
        "autocast_dtypes": sorted(set(computed_in)),
    }
    if args.fp8:
        import habana_frameworks.torch.hpex.experimental.transformer_engine as te

        result["mixed_precision"] = trainer.accelerator.mixed_precision
        result["plain_linears"] = sum(type(m) is torch.nn.Linear for m in trainer.model.modules())
        result["te_linears"] = sum(isinstance(m, te.Linear) for m in trainer.model.modules())
    return result


if __name__ == "__main__":
    print(json.dumps({name: train(name, sys.argv[1]) for name in sys.argv[2:]}))

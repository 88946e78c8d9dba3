"""Hugging Face optimum-habana's GaudiTrainer on a tiny Llama, as a user of optimum-habana writes it.

The model is built from a LlamaConfig with random weights and trained on random token ids (no download, no tokenizer),
with `use_habana=True`, the mode from the command line (`lazy` / `eager`, matching PT_HPU_LAZY_MODE as optimum-habana
requires), bf16 autocast, and the Gaudi options that call Habana's kernels: fused AdamW, fused gradient-norm clipping
(GaudiConfig). Nothing here knows about hpu_nb. Prints one JSON line: the logged losses, the optimizer and clip-norm
classes the trainer used and how often each ran, the parameters' device, the dtype a linear layer computed in under
autocast.
"""

from __future__ import annotations

import json
import sys
import tempfile

import habana_frameworks.torch.core as htcore
import torch
from habana_frameworks.torch.hpex.normalization import FusedClipNorm
from torch.optim.optimizer import register_optimizer_step_post_hook
from optimum.habana import GaudiConfig, GaudiTrainer, GaudiTrainingArguments
from transformers import AutoModelForCausalLM, LlamaConfig

VOCAB = 64


def tiny_llama_config() -> LlamaConfig:
    return LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def token_dataset(sequences: int = 8, length: int = 16) -> list[dict[str, torch.Tensor]]:
    """A few random sequences to memorise: causal-LM examples with labels = input ids."""
    ids = torch.randint(0, VOCAB, (sequences, length), generator=torch.Generator().manual_seed(0))
    return [{"input_ids": row, "attention_mask": torch.ones_like(row), "labels": row.clone()} for row in ids]


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


def main(mode: str) -> None:
    args = GaudiTrainingArguments(
        output_dir=tempfile.mkdtemp(), use_habana=True, use_lazy_mode=mode == "lazy", bf16=True, max_grad_norm=1.0,
        per_device_train_batch_size=4, max_steps=20, learning_rate=5e-3, logging_steps=1, save_strategy="no",
        report_to=[], seed=0, dataloader_num_workers=0,
    )
    gaudi_config = GaudiConfig(use_fused_adam=True, use_fused_clip_norm=True, use_torch_autocast=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_llama_config())  # after the arguments: the Gaudi Llama
    computed_in: list[str] = []
    stepped: list[str] = []  # torch's global hook sees every optimizer.step(), whoever calls it
    register_optimizer_step_post_hook(lambda optimizer, *_: stepped.append(qualified(optimizer)))
    clipped = count_calls(FusedClipNorm, "clip_norm")
    model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, out: computed_in.append(str(out.dtype)))
    trainer = GaudiTrainer(model=model, args=args, gaudi_config=gaudi_config, train_dataset=token_dataset())
    trainer.train()
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # accelerate wraps it
    print(json.dumps({
        "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
        "optimizer": qualified(optimizer),
        "clip_norm": qualified(trainer.FusedNorm),
        "steps_by": {name: stepped.count(name) for name in set(stepped)},
        "clip_norm_calls": len(clipped),
        "mark_steps": getattr(htcore, "placed_mark_steps", None),  # the emulated Gaudi counts them in lazy mode
        "device": str(next(model.parameters()).device),
        "model_class": qualified(model),
        "autocast_dtypes": sorted(set(computed_in)),
    }))


if __name__ == "__main__":
    main(sys.argv[1])

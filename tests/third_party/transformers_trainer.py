"""A tiny Llama trained with plain transformers 5 on a Gaudi, the way Hugging Face's docs write it (no optimum-habana):
transformers finds the `hpu` itself (`is_torch_hpu_available`), `Trainer` puts the model there, bf16 autocasts it.

    python transformers_trainer.py [--compile] [--steps N]

--compile: `torch_compile=True` (transformers picks the `hpu_backend` on a Gaudi) with SDPA attention, the default of
every Hugging Face model. The model is built from a config with random weights and learns a fixed set of random token
sequences (nothing is downloaded). The last stdout line is a JSON summary.
"""

import argparse
import json
import time

import torch
from torch._dynamo.utils import counters
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments
from transformers.utils import is_torch_hpu_available

parser = argparse.ArgumentParser()
parser.add_argument("--compile", action="store_true")
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--output-dir", default="out")
args = parser.parse_args()


class RandomTokens(Dataset):
    """`count` fixed random sequences to memorise: the loss falls well below ln(vocab) in a few dozen steps."""

    def __init__(self, count=16, length=32, vocab=128, seed=0):
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (count, length), generator=generator)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class LossAndMemory(TrainerCallback):
    def __init__(self):
        self.losses = []
        self.memory_in_use = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(logs["loss"])
            self.memory_in_use.append(torch.hpu.memory_allocated())


torch.manual_seed(0)
config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
computed_in = set()  # what bf16 autocast made of the logits
model.lm_head.register_forward_hook(lambda module, inputs, output: computed_in.add(str(output.dtype)))
training_args = TrainingArguments(
    output_dir=args.output_dir,
    max_steps=args.steps,
    per_device_train_batch_size=8,
    learning_rate=3e-3,
    warmup_steps=0,
    lr_scheduler_type="constant",
    logging_steps=1,
    bf16=True,
    torch_compile=args.compile,
    save_strategy="no",
    report_to=[],
    dataloader_num_workers=0,
    disable_tqdm=True,
    seed=0,
)
recorder = LossAndMemory()
trainer = Trainer(model=model, args=training_args, train_dataset=RandomTokens(), callbacks=[recorder])
started = time.perf_counter()
trainer.train()
seconds = time.perf_counter() - started
stats = torch.hpu.memory_stats()
parameter = next(trainer.model.parameters())
print(json.dumps({
    "hpu_available": is_torch_hpu_available(),
    "args_device": str(training_args.device),
    "parameter_device": str(parameter.device),
    "parameter_dtype": str(parameter.dtype),
    "attn_implementation": model.config._attn_implementation,
    "computed_in": sorted(computed_in),
    "compiled": hasattr(trainer.model_wrapped, "_orig_mod") or hasattr(trainer.model, "_orig_mod"),
    "compile_backend": training_args.torch_compile_backend,
    "graphs": counters["stats"]["unique_graphs"],
    "graph_breaks": dict(counters["graph_break"]),
    "losses": recorder.losses,
    "memory_in_use": recorder.memory_in_use,
    "max_in_use": stats.get("MaxInUse"),
    "seconds": round(seconds, 2),
}))

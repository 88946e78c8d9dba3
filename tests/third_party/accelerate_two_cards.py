"""Two Gaudi cards with plain accelerate and transformers 5, launched as their users launch it:

    accelerate launch --num_processes 2 accelerate_two_cards.py OUTPUT_DIR

accelerate finds the `hpu` itself (`is_hpu_available(init_hccl=True)`: DistributedType.MULTI_HPU over `hccl`). Each
rank trains a tiny Llama (random weights from a config, random tokens, nothing downloaded) in an accelerate loop,
gathers a 2-D tensor, then a `transformers.Trainer` trains and evaluates on both cards. Each rank writes its JSON
summary to OUTPUT_DIR/rank<N>.json.
"""

import json
import os
import sys

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType
from torch.utils.data import DataLoader, Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

output_dir = sys.argv[1]


class RandomTokens(Dataset):
    def __init__(self, count, length=32, vocab=128, seed=0):
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (count, length), generator=generator)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def tiny_llama():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM._from_config(config, attn_implementation="sdpa")


def flat_weights(model):
    return torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])


accelerator = Accelerator(mixed_precision="bf16")
rank = accelerator.process_index
result = {
    "rank": rank,
    "num_processes": accelerator.num_processes,
    "distributed_type": str(accelerator.distributed_type),
    "multi_hpu": accelerator.distributed_type == DistributedType.MULTI_HPU,
    "backend": accelerator.state.backend,
    "process_group_backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
    "device": str(accelerator.device),
}

# 1. An accelerate training loop: DDP over hccl keeps the ranks' weights equal.
model = tiny_llama()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
loader = DataLoader(RandomTokens(32), batch_size=4, shuffle=True)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
losses = []
for batch in loader:  # 32 sequences, 4 per rank and step: 4 steps
    loss = model(**batch).loss
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    losses.append(accelerator.gather(loss.detach()).mean().item())
weights = flat_weights(accelerator.unwrap_model(model))
both = accelerator.gather(weights[None])  # (2, n): one row per rank
result["loop_losses"] = losses
result["loop_weights_equal"] = torch.equal(both[0], both[1])
result["loop_weights_moved"] = not torch.equal(weights.cpu(), flat_weights(tiny_llama()))

# 2. gather of a 2-D tensor: the ranks' rows in rank order.
mine = torch.arange(6, dtype=torch.float32, device=accelerator.device).reshape(2, 3) + 100 * rank
gathered = accelerator.gather(mine)
result["gathered_2d"] = gathered.cpu().tolist()
result["gathered_2d_device"] = str(gathered.device)

# 3. transformers.Trainer on both cards: train a few steps, then evaluate (its losses gathered across the ranks).
accelerator.wait_for_everyone()
args = TrainingArguments(output_dir=os.path.join(output_dir, "trainer"), max_steps=4, per_device_train_batch_size=4,
                         per_device_eval_batch_size=4, learning_rate=3e-3, bf16=True, logging_steps=1,
                         save_strategy="no", report_to=[], disable_tqdm=True, seed=0)
trainer = Trainer(model=tiny_llama(), args=args, train_dataset=RandomTokens(32), eval_dataset=RandomTokens(16, seed=1))
trainer.train()
metrics = trainer.evaluate()
trained = trainer.accelerator.unwrap_model(trainer.model)
both = trainer.accelerator.gather(flat_weights(trained)[None])
result["trainer_device"] = str(args.device)
result["trainer_parallel_mode"] = str(args.parallel_mode)
result["trainer_world_size"] = args.world_size
result["trainer_weights_equal"] = torch.equal(both[0], both[1])
result["eval_loss"] = metrics["eval_loss"]
result["eval_samples"] = len(trainer.eval_dataset)
# The same loss by hand on this rank alone: every sequence has the same length, so the mean of the batches' losses
# the Trainer gathers is the loss of the whole set in one batch.
trained.eval()
with torch.no_grad(), torch.autocast("hpu", dtype=torch.bfloat16):
    ids = trainer.eval_dataset.ids.to(accelerator.device)
    result["eval_loss_by_hand"] = trained(input_ids=ids, labels=ids).loss.item()

with open(os.path.join(output_dir, f"rank{rank}.json"), "w") as handle:
    json.dump(result, handle)
accelerator.end_training()

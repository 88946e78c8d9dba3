"""Greedy generation with plain transformers 5 on a Gaudi gives the CPU's tokens: a tiny Llama (random weights from a
config, nothing downloaded) generates from the same random prompts on `cpu` and on `hpu`, with KV cache, batched, the
second prompt left-padded. The last stdout line is a JSON summary.
"""

import copy
import json

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.utils import is_torch_hpu_available

torch.manual_seed(0)
config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                     pad_token_id=0, bos_token_id=1, eos_token_id=2)
model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa").eval()
input_ids = torch.randint(3, 128, (2, 10))
attention_mask = torch.ones_like(input_ids)
input_ids[1, :3] = config.pad_token_id  # left padding, as for batched generation
attention_mask[1, :3] = 0


def generate(device):
    on_device = copy.deepcopy(model).to(device)
    with torch.no_grad():
        out = on_device.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                                 max_new_tokens=16, min_new_tokens=16, do_sample=False, num_beams=1)
    return out


on_cpu = generate("cpu")
on_hpu = generate("hpu")
print(json.dumps({
    "hpu_available": is_torch_hpu_available(),
    "device": str(on_hpu.device),
    "cpu": on_cpu.tolist(),
    "hpu": on_hpu.cpu().tolist(),
    "new_tokens": on_hpu.shape[1] - input_ids.shape[1],
}))

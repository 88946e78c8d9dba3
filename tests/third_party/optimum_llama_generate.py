"""optimum-habana's generation with HPU graphs against plain transformers on the CPU, from the same weights.

First plain transformers (before optimum-habana is imported): a tiny randomly initialised Llama generates greedily
on the CPU, and its weights are saved. Then, as optimum-habana's text-generation example does:
`adapt_transformers_to_gaudi()`, the same weights loaded (now as optimum-habana's Gaudi Llama), moved to "hpu",
wrapped with `wrap_in_hpu_graph`, and `generate(..., lazy_mode=True, hpu_graphs=True)` with static shapes; once with
the default attention and once with `use_flash_attention=True` (Habana's FusedSDPA, whose calls are counted). Prints
one JSON line.
"""

from __future__ import annotations

import copy
import json
import tempfile

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

NEW_TOKENS = 10


def main() -> None:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         bos_token_id=0, eos_token_id=1, pad_token_id=2)
    prompt = torch.tensor([[5, 9, 17, 33, 12, 40]])
    mask = torch.ones_like(prompt)
    plain = LlamaForCausalLM(config).eval()
    weights = tempfile.mkdtemp()
    plain.save_pretrained(weights)
    with torch.no_grad():
        reference = plain.generate(prompt, attention_mask=mask, max_new_tokens=NEW_TOKENS,
                                   min_new_tokens=NEW_TOKENS, do_sample=False)

    from habana_frameworks.torch.hpex.kernels import FusedSDPA
    from habana_frameworks.torch.hpu import wrap_in_hpu_graph
    from optimum.habana.transformers.modeling_utils import adapt_transformers_to_gaudi

    adapt_transformers_to_gaudi()
    model = AutoModelForCausalLM.from_pretrained(weights).eval().to(torch.device("hpu"))
    model_class = f"{type(model).__module__}.{type(model).__qualname__}"
    model = wrap_in_hpu_graph(model)
    generation_config = copy.deepcopy(model.generation_config)
    generation_config.max_new_tokens = NEW_TOKENS
    generation_config.do_sample = False
    generation_config.use_cache = True
    generation_config.static_shapes = True
    generation_config.ignore_eos = True

    sdpa_calls = []
    fused_sdpa_apply = FusedSDPA.apply
    FusedSDPA.apply = lambda *a, **kw: (sdpa_calls.append(1), fused_sdpa_apply(*a, **kw))[1]  # count, then run

    outputs = {}
    with torch.no_grad():
        for name, extra in {"default": {}, "flash": {"use_flash_attention": True,
                                                     "flash_attention_causal_mask": True}}.items():
            out = model.generate(prompt.to("hpu"), attention_mask=mask.to("hpu"), generation_config=generation_config,
                                 lazy_mode=True, hpu_graphs=True, **extra)
            outputs[name] = {"tokens": out.cpu().tolist(), "device": str(out.device),
                             "fused_sdpa_calls": len(sdpa_calls)}
            sdpa_calls.clear()
    print(json.dumps({"reference": reference.tolist(), "outputs": outputs, "model_class": model_class,
                      "graph_wrapped": hasattr(model, "clear_cache")}))


if __name__ == "__main__":
    main()

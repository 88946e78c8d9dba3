"""torch.compile(backend="hpu_backend") on the emulated Gaudi: the same code as on a Gaudi, measured memory included.

The emulated backend captures with TorchDynamo and splits forward / backward with AOTAutograd (torch's "aot_eager"),
then runs the graphs with the device's kernels, so every tensor a compiled graph allocates is counted by the device.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch

from hpu_nb.emulator import hpu_device
from hpu_nb.runtime import get_backend
from tests.helpers.models import quiet_trainer_kwargs, regression_data

ROOT = Path(__file__).resolve().parents[2]
HIDDEN, BATCH = 2048, 256


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, HIDDEN), torch.nn.GELU(), torch.nn.Linear(HIDDEN, 1)).to("hpu")


def test_compiled_model_matches_eager_and_counts_its_graphs() -> None:
    backend = get_backend()
    torch._dynamo.reset()
    before = backend.metrics()["graph_compilation"]["TotalNumber"]
    model, x = _mlp(), torch.randn(BATCH, 64, device="hpu")
    compiled = torch.compile(model, backend=backend.compile_backend)
    out = compiled(x)
    assert out.device.type == "hpu" and torch.allclose(out.cpu(), model(x).cpu(), atol=1e-5)
    out.sum().backward()
    assert model[0].weight.grad is not None and model[0].weight.grad.device.type == "hpu"
    assert backend.metrics()["graph_compilation"]["TotalNumber"] == before + 1  # one graph, forward and backward
    compiled(x)
    assert backend.metrics()["graph_compilation"]["TotalNumber"] == before + 1  # reused, not compiled again
    assert set(backend.metrics()) == {"graph_compilation", "cpu_fallback", "memory_defragmentation"}


def test_memory_of_compiled_graphs_is_counted() -> None:
    """The hidden activation (BATCH x HIDDEN floats) lives inside the compiled graph: the device still counts it."""
    backend = get_backend()
    torch._dynamo.reset()
    model, x = _mlp(), torch.randn(BATCH, 64, device="hpu")
    compiled = torch.compile(model, backend=backend.compile_backend)
    compiled(x).sum().backward()  # compile once
    model.zero_grad(set_to_none=True)
    backend.reset_peak_memory_stats()
    at_rest = backend.memory_stats()["InUse"]
    compiled(x).sum().backward()
    peak = backend.memory_stats()["MaxInUse"] - at_rest
    activation = BATCH * HIDDEN * 4
    assert peak >= 2 * activation  # the hidden layer's output and its GELU, saved for backward
    params = sum(p.numel() * 4 for p in model.parameters())
    assert backend.memory_stats()["InUse"] - at_rest == params  # afterwards only the gradients are left


def test_a_compiled_lightning_module_trains_through_lightnings_support() -> None:
    from tests.core.test_gaudi_lightning import CompilableModel

    torch._dynamo.reset()
    model = CompilableModel()
    before = model.layer.weight.detach().clone()
    trainer = L.Trainer(**quiet_trainer_kwargs(accelerator="hpu", devices=1, max_steps=3, limit_val_batches=0))
    trainer.fit(torch.compile(model, backend="hpu_backend"), regression_data(n=48, features=16, batch_size=16))
    assert trainer.global_step == 3 and not torch.equal(before, model.layer.weight.detach().cpu())
    assert model._compiler_ctx is not None and model.layer.weight.device.type == "cpu"  # Lightning's compile context


def test_plain_torch_code_finds_hpu_backend_without_hpu_nb() -> None:
    """`import torch` alone (hpu_nb installed): torch finds "hpu_backend" through hpu_nb's entry point."""
    code = ("import torch\nm = torch.nn.Linear(4, 2).to('hpu')\nx = torch.randn(3, 4, device='hpu')\n"
            "y = torch.compile(m, backend='hpu_backend')(x)\nprint(y.device, torch.allclose(y.cpu(), m(x).cpu()))")
    env = {k: v for k, v in os.environ.items() if k != "HPU_NB_BACKEND"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                          cwd=str(ROOT))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["hpu:0", "True"]
    assert hpu_device.is_loaded()


# -- attention, as every Hugging Face model runs it (SDPA is transformers' default attention) ------------------------
def _attention_inputs(requires_grad: bool) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8, generator=generator) for _ in range(3))
    mask = torch.rand(2, 1, 16, 16, generator=generator) > 0.3
    mask[..., 0] = True  # every query sees at least one key
    return tuple(t.to("hpu").requires_grad_(requires_grad and t.is_floating_point()) for t in (q, k, v, mask))


@pytest.mark.parametrize("backend", ["hpu_backend", "eager"])
@pytest.mark.parametrize("masking", ["is_causal", "bool_mask"])
def test_compiled_sdpa_on_hpu_trains_as_eager_does(backend: str, masking: str) -> None:
    """The trace asks the device which attention kernel eager mode would run (_fused_sdp_choice, redispatched to the
    hpu kernel with FakeTensors): the device answers from shapes alone, and the compiled attention equals eager's,
    gradients included."""
    import torch.nn.functional as F

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if masking == "is_causal":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    torch._dynamo.reset()
    results = []
    for run in (attention, torch.compile(attention, backend=backend)):
        q, k, v, mask = _attention_inputs(requires_grad=True)
        out = run(q, k, v, mask)
        out.square().sum().backward()
        results.append([t.detach().cpu() for t in (out, q.grad, k.grad, v.grad)])
    assert all(torch.allclose(c, e, atol=1e-5) for c, e in zip(results[1], results[0]))
    assert results[1][0].device.type == "cpu" and results[1][1].abs().sum() > 0

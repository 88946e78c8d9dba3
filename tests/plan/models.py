"""Small LightningModules the plan tests and benchmarks/bench_plan.py trace and measure: an MLP, a CNN, a
transformer with SDPA (and a Llama-shaped one, built from a config)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from torch import nn
from torch.utils.checkpoint import checkpoint
from typing_extensions import override


class _Classifier(LightningModule):
    @override
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("loss", loss)
        return loss

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class MLP(_Classifier):
    def __init__(self, width: int = 512, depth: int = 3, inputs: int = 256, classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(depth):
            layers += [nn.Linear(inputs if i == 0 else width, width), nn.ReLU()]
        self.body = nn.Sequential(*layers, nn.Linear(width, classes))

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class CNN(_Classifier):
    def __init__(self, channels: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
            nn.Linear(2 * channels * 16, classes),
        )

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


@dataclass(frozen=True)
class TransformerConfig:
    vocab: int = 512
    d_model: int = 128
    layers: int = 2
    heads: int = 4
    ffn: int = 512
    seq: int = 64
    llama: bool = False  # RMSNorm + SwiGLU, no biases, as Llama


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        bias = not cfg.llama
        self.heads = cfg.heads
        self.norm1 = RMSNorm(cfg.d_model) if cfg.llama else nn.LayerNorm(cfg.d_model)
        self.norm2 = RMSNorm(cfg.d_model) if cfg.llama else nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=bias)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=bias)
        self.llama = cfg.llama
        if cfg.llama:
            self.gate = nn.Linear(cfg.d_model, cfg.ffn, bias=False)
        self.up = nn.Linear(cfg.d_model, cfg.ffn, bias=bias)
        self.down = nn.Linear(cfg.ffn, cfg.d_model, bias=bias)

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attn.transpose(1, 2).reshape(b, s, d))
        h = self.norm2(x)
        h = F.silu(self.gate(h)) * self.up(h) if self.llama else F.gelu(self.up(h))
        return x + self.down(h)


class Transformer(LightningModule):
    """A decoder-only language model: token embedding, blocks with SDPA, an untied output head."""

    def __init__(self, cfg: TransformerConfig = TransformerConfig()) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.d_model) if cfg.llama else nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    @override
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    @override
    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        logits = self(batch[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


class CheckpointedTransformer(Transformer):
    """The transformer with activation checkpointing on every block (torch.utils.checkpoint, non-reentrant)."""

    @override
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return self.head(self.norm(x))


LLAMA_7B = TransformerConfig(vocab=32000, d_model=4096, layers=32, heads=32, ffn=11008, seq=2048, llama=True)


def non_embedding_params(model: Transformer) -> int:
    """Kaplan et al.'s N: every parameter but the token embedding (the untied head is a matmul, so it counts)."""
    return sum(p.numel() for name, p in model.named_parameters() if not name.startswith("embed."))


def analytic_flops(model: Transformer, batch: int) -> float:
    """6 N tokens + attention's 12 L d s^2 b: a dense transformer's forward + backward FLOPs (tokens = b (s - 1))."""
    cfg = model.cfg
    seq = cfg.seq - 1  # the step feeds tokens[:, :-1]
    return 6 * non_embedding_params(model) * batch * seq + 12 * cfg.layers * cfg.d_model * seq**2 * batch


def batches(kind: str, size: int) -> object:
    """One CPU batch for a model kind: "mlp", "cnn", "transformer"."""
    if kind == "mlp":
        return torch.randn(size, 256), torch.randint(0, 10, (size,))
    if kind == "cnn":
        return torch.randn(size, 3, 32, 32), torch.randint(0, 10, (size,))
    return torch.randint(0, 512, (size, TransformerConfig().seq))


__all__ = ["CNN", "LLAMA_7B", "MLP", "CheckpointedTransformer", "Transformer", "TransformerConfig", "analytic_flops",
           "batches", "non_embedding_params"]

"""habana_frameworks.torch.hpex.kernels.RotaryPosEmbeddingHelper, emulated: Gaudi's rotary position embedding.

Modelled on the bridge's hpex/kernels/RotaryPosEmbeddingHelper.py (release 1.19) and the maths its docstring and
tests give: out = p * cos + rotate(p) * sin, where rotate is rotate-half in BLOCKWISE mode (GPT-NeoX / LLaMA:
[x1, x2] -> [-x2, x1]) and rotate-every-two in PAIRWISE mode (GPT-J / ChatGLM: (a, b) pairs -> (-b, a)).
- `position_ids` pick rows of a [1, 1, max_positions, dim] cos/sin table (V2, as LLaMA's `cos[position_ids]`);
- `offset` (BLOCKWISE only) is where cos/sin start along their last dimension (V1: GPT-NeoX <= 4.27.4);
- dtypes are matched as Habana does: any float32 among p/cos/sin makes all three float32, else cos/sin take p's dtype.
V1 / V2 / V3 (ChatGLM's `rope_cache`) are autograd Functions with Habana's `apply` signatures, and backward is the
transpose of the forward (g * cos - rotate(g * sin)). Computed with torch ops in float32 on the emulated Gaudi.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

import torch

__emulated__ = True


class RotaryPosEmbeddingMode(Enum):
    BLOCKWISE = 0
    PAIRWISE = 1


def match_data_types(input: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Habana's dtype rule: float32 wins if any of the three is float32; otherwise cos/sin follow the input."""
    if torch.float32 in (input.dtype, cos.dtype, sin.dtype):
        return input.float(), cos.float(), sin.float()
    return input, cos.to(input.dtype), sin.to(input.dtype)


def _rotate(x: torch.Tensor, mode: RotaryPosEmbeddingMode) -> torch.Tensor:
    if mode is RotaryPosEmbeddingMode.BLOCKWISE:
        first, second = x.chunk(2, dim=-1)
        return torch.cat((-second, first), dim=-1)
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def _select(table: torch.Tensor, p: torch.Tensor, position_ids: torch.Tensor | None, offset: int,
            mode: RotaryPosEmbeddingMode) -> torch.Tensor:
    """The cos (or sin) values each element of p is rotated with."""
    if position_ids is not None:
        if position_ids.dim() == 1:
            table = table.index_select(-2, position_ids.to(table.device))
        elif position_ids.dim() == 2 and table.dim() == 4:
            batch, rows = position_ids.shape
            index = position_ids.to(table.device)[:, None, :, None].expand(batch, table.shape[1], rows, table.shape[3])
            table = torch.gather(table.expand(batch, -1, -1, -1), 2, index)
        else:
            raise RuntimeError(
                f"rotary_pos_embedding: position_ids of shape {tuple(position_ids.shape)} index a 4-D cos/sin table"
                f" [1, 1, positions, dim] (or 1-D ids any table); got cos/sin of shape {tuple(table.shape)}."
            )
    if mode is RotaryPosEmbeddingMode.BLOCKWISE and (offset or table.shape[-1] != p.shape[-1]):
        table = table[..., offset:offset + p.shape[-1]]
    return table


def _check_head_dim(p: torch.Tensor, mode: RotaryPosEmbeddingMode) -> None:
    """Both rotations pair features up (BLOCKWISE: i with i + dim/2; PAIRWISE: 2i with 2i + 1): an odd head dim has
    no such pairing. The bridge does not check it; its reference maths (rotate-half / rotate-every-two) need it."""
    if p.dim() == 0 or p.shape[-1] % 2:
        dim = p.shape[-1] if p.dim() else None
        raise RuntimeError(f"rotary_pos_embedding: the head dim (p's last dimension) must be even for {mode.name} "
                           f"rotation (it rotates features in pairs); got {dim}.")


def rope_forward(p: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: torch.Tensor | None,
                 offset: int, mode: RotaryPosEmbeddingMode) -> torch.Tensor:
    """p * cos + rotate(p) * sin, in the matched dtype (computed in float32)."""
    mode_value = mode.value  # Habana reads .value: a plain int is refused (AttributeError), as there
    mode = RotaryPosEmbeddingMode(mode_value)
    _check_head_dim(p, mode)
    p, cos, sin = match_data_types(p, cos, sin)
    with torch.autocast("hpu", enabled=False):
        x = p.float()
        cos, sin = _select(cos.float(), x, position_ids, offset, mode), _select(sin.float(), x, position_ids, offset,
                                                                               mode)
        return (x * cos + _rotate(x, mode) * sin).to(p.dtype)


def rope_backward(grad: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: torch.Tensor | None,
                  offset: int, mode: RotaryPosEmbeddingMode) -> torch.Tensor:
    """The gradient of rope_forward with respect to p: grad * cos - rotate(grad * sin) (rotate^T = -rotate)."""
    grad, cos, sin = match_data_types(grad, cos, sin)
    with torch.autocast("hpu", enabled=False):
        g = grad.float()
        cos, sin = _select(cos.float(), g, position_ids, offset, mode), _select(sin.float(), g, position_ids, offset,
                                                                               mode)
        return (g * cos - _rotate(g * sin, mode)).to(grad.dtype)


class _RotaryPosEmbedding(torch.autograd.Function):
    """apply_rotary_pos_emb's general form, differentiable in p."""

    @staticmethod
    def forward(ctx: Any, p: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: torch.Tensor | None,
                offset: int, mode: RotaryPosEmbeddingMode) -> torch.Tensor:
        ctx.save_for_backward(cos, sin, position_ids)
        ctx.offset, ctx.mode = offset, mode
        return rope_forward(p, cos, sin, position_ids, offset, mode)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        cos, sin, position_ids = ctx.saved_tensors
        return rope_backward(grad, cos, sin, position_ids, ctx.offset, ctx.mode), None, None, None, None, None


def apply_rotary_pos_emb(p: torch.Tensor, *args: Any) -> torch.Tensor:
    """Rotary embedding of p. `apply_rotary_pos_emb(p, cos, sin, position_ids=None, offset=0, mode=BLOCKWISE)`, or
    `apply_rotary_pos_emb(p, rope_cache)` for ChatGLM's cos/sin cache (RotaryPosEmbeddingHelperV3)."""
    if len(args) > 1:
        cos, sin = args[0], args[1]
        position_ids = args[2] if len(args) > 2 else None
        offset = args[3] if len(args) > 3 else 0
        mode = args[4] if len(args) > 4 else RotaryPosEmbeddingMode.BLOCKWISE
        return _RotaryPosEmbedding.apply(p, cos, sin, position_ids, offset, mode)
    return RotaryPosEmbeddingHelperV3.apply(p, args[0])


class RotaryPosEmbeddingHelperV1(torch.autograd.Function):
    """GPT-NeoX (transformers <= 4.27.4) form: `apply(p, cos, sin, offset)`, BLOCKWISE."""

    @staticmethod
    def forward(ctx: Any, p: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, offset: int) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        ctx.offset = offset
        return rope_forward(p, cos, sin, None, offset, RotaryPosEmbeddingMode.BLOCKWISE)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        cos, sin = ctx.saved_tensors
        return rope_backward(grad, cos, sin, None, ctx.offset, RotaryPosEmbeddingMode.BLOCKWISE), None, None, None


class RotaryPosEmbeddingHelperV2(torch.autograd.Function):
    """LLaMA / transformers > 4.27.4: `apply(p, cos, sin, position_ids)`, BLOCKWISE (optimum-habana's FusedRoPE)."""

    @staticmethod
    def forward(ctx: Any, p: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                position_ids: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(cos, sin, position_ids)
        return rope_forward(p, cos, sin, position_ids, 0, RotaryPosEmbeddingMode.BLOCKWISE)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        cos, sin, position_ids = ctx.saved_tensors
        return rope_backward(grad, cos, sin, position_ids, 0, RotaryPosEmbeddingMode.BLOCKWISE), None, None, None


def parse_rope_cache(p: torch.Tensor, rope_cache: torch.Tensor):
    """ChatGLM layout: p [sq, b, heads, dim], rope_cache [>= sq, (b,) rot_dim / 2, 2] holding (cos, sin) pairs. Gives
    the rotated part of p, the part passed through, and cos/sin repeated per pair, in p's dtype."""
    seq, heads = p.size(0), p.size(2)
    rot_dim = rope_cache.shape[-2] * 2
    rotated, passed = p[..., :rot_dim], p[..., rot_dim:]
    cache = rope_cache[:seq].reshape(seq, -1, 1, rot_dim // 2, 2)
    cos = torch.repeat_interleave(cache[..., 0], 2, dim=-1).to(p.dtype)
    sin = torch.repeat_interleave(cache[..., 1], 2, dim=-1).to(p.dtype)
    return rotated.reshape(seq, -1, heads, rot_dim), passed, sin, cos


class RotaryPosEmbeddingHelperV3(torch.autograd.Function):
    """ChatGLM form: `apply(p, rope_cache)`, PAIRWISE on the first rot_dim features, the rest passed through."""

    @staticmethod
    def forward(ctx: Any, p: torch.Tensor, rope_cache: torch.Tensor) -> torch.Tensor:
        rotated, passed, sin, cos = parse_rope_cache(p, rope_cache)
        ctx.save_for_backward(rope_cache)
        out = rope_forward(rotated, cos, sin, None, 0, RotaryPosEmbeddingMode.PAIRWISE)
        return out if passed.shape[-1] == 0 else torch.cat((out, passed.to(out.dtype)), dim=-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (rope_cache,) = ctx.saved_tensors
        rotated, passed, sin, cos = parse_rope_cache(grad, rope_cache)
        grad_p = rope_backward(rotated, cos, sin, None, 0, RotaryPosEmbeddingMode.PAIRWISE)
        return (grad_p if passed.shape[-1] == 0 else torch.cat((grad_p, passed.to(grad_p.dtype)), dim=-1)), None

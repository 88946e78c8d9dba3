"""The attention maths behind the emulated FusedSDPA (emulated Gaudi): scores, masks, dropout, output, gradients.

Written with torch ops in float32 (float64 stays float64) whatever the input dtype, so the emulated Gaudi gives the
reference answer; the caller casts results back. Tensors may carry extra broadcast dimensions (grouped-query
attention puts the query heads of one group next to a key/value head of size 1): gradients are summed back to each
input's shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__emulated__ = True


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Low-precision inputs are computed in float32, as Gaudi's softmax accumulates."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@dataclass(frozen=True)
class Masking:
    """What hides a key from a query: an attention mask (bool: True attends; float: added to the scores), the causal
    triangle (top-left aligned, as torch's), and per-batch valid lengths with their padding side."""

    attn_mask: torch.Tensor | None = None
    is_causal: bool = False
    valid_seq_len: torch.Tensor | None = None
    seq_padding_type: str = "left"


def _valid_keys(valid_seq_len: torch.Tensor, padding: str, scores: torch.Tensor) -> torch.Tensor:
    """Keys inside each batch row's valid length: the last L keys with left padding, the first L with right padding."""
    keys = scores.shape[-1]
    positions = torch.arange(keys, device=scores.device)
    lengths = valid_seq_len.reshape(-1, *([1] * (scores.dim() - 1))).to(scores.device)
    if padding == "left":
        return positions >= keys - lengths
    if padding == "right":
        return positions < lengths
    raise ValueError(
        f"FusedSDPA: seq_padding_type {padding!r} with valid_seq_len: the Gaudi kernel knows 'left' and 'right'."
    )


def attention_probs(q: torch.Tensor, k: torch.Tensor, scale: float, masking: Masking) -> torch.Tensor:
    """softmax(scale * q k^T + masks) in the compute dtype; a query that may see no key gets all-zero probabilities."""
    dtype = compute_dtype(q.dtype)
    scores = torch.matmul(q.to(dtype), k.to(dtype).transpose(-2, -1)) * scale
    mask = masking.attn_mask
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.to(dtype)
    if masking.is_causal:
        causal = torch.ones(scores.shape[-2], scores.shape[-1], dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    if masking.valid_seq_len is not None:
        scores = scores.masked_fill(~_valid_keys(masking.valid_seq_len, masking.seq_padding_type, scores),
                                    float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    sees_nothing = torch.isneginf(scores).all(dim=-1, keepdim=True)
    return probs.masked_fill(sees_nothing, 0.0)


def dropout_keep(probs: torch.Tensor, dropout_p: float) -> torch.Tensor | None:
    """Which attention weights survive dropout (None when there is no dropout): each kept with probability 1 - p."""
    if dropout_p <= 0.0:
        return None
    return torch.rand(probs.shape, device=probs.device, dtype=probs.dtype) >= dropout_p


def _dropped(probs: torch.Tensor, keep: torch.Tensor | None, dropout_p: float) -> torch.Tensor:
    """Dropout applied with the given keep mask; kept weights are scaled by 1 / (1 - p) (p = 1 drops everything)."""
    if keep is None:
        return probs
    factor = 0.0 if dropout_p >= 1.0 else 1.0 / (1.0 - dropout_p)
    return probs * keep.to(probs.dtype) * factor


def attention_output(probs: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None,
                     dropout_p: float) -> torch.Tensor:
    """dropout(P) v in the compute dtype."""
    return torch.matmul(_dropped(probs, keep, dropout_p), v.to(probs.dtype))


def attention_grads(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, probs: torch.Tensor,
    keep: torch.Tensor | None, dropout_p: float, scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of out = dropout(softmax(scale q k^T + mask)) v, each summed back to its input's shape."""
    dtype = probs.dtype
    dout, qc, kc, vc = dout.to(dtype), q.to(dtype), k.to(dtype), v.to(dtype)
    dv = torch.matmul(_dropped(probs, keep, dropout_p).transpose(-2, -1), dout)
    dprobs = _dropped(torch.matmul(dout, vc.transpose(-2, -1)), keep, dropout_p)
    dscores = probs * (dprobs - (dprobs * probs).sum(dim=-1, keepdim=True))
    dq = torch.matmul(dscores, kc) * scale
    dk = torch.matmul(dscores.transpose(-2, -1), qc) * scale
    return dq.sum_to_size(q.shape), dk.sum_to_size(k.shape), dv.sum_to_size(v.shape)

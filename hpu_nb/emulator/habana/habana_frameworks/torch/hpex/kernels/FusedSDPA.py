"""habana_frameworks.torch.hpex.kernels.FusedSDPA, emulated: Gaudi's fused scaled-dot-product attention.

Modelled on the bridge's hpex/kernels/FusedSDPA.py (release 1.19): the same `FusedSDPA.apply(q, k, v, attn_mask,
dropout_p, is_causal, scale, softmax_mode, recompute_mode, valid_seq_len, seq_padding_type, return_dropout_mask,
return_attn_probs)` (positional, as every autograd Function), the same argument checks (AssertionError, as Habana's
asserts), grouped-query k/v (fewer key/value heads than query heads, each serving a group of query heads; one k/v head
broadcasts), boolean (True attends) or additive float masks, `valid_seq_len` with left/right padding (inference with
the causal mask only), and the same outputs (the attention probabilities / dropout mask in inference on request).
Where Habana's sources say nothing, the emulation chooses and says so: a mask given with is_causal=True applies both;
a query that may see no key at all (left padding under valid_seq_len) gets a zero output; and what the Gaudi graph
would take but answer wrongly is refused as torch's SDPA refuses it (`_check_inputs`: an integer mask, a mask that does
not broadcast to the scores, integer q/k/v, grouped heads that do not divide, dropout_p outside [0, 1], an unknown
softmax_mode).

On the emulated Gaudi the maths is computed with torch's CPU ops in float32 and returned in the input dtype (under
`torch.autocast("hpu")` q/k/v are first cast to the autocast dtype, as the Gaudi op is in its lower-precision list).
`softmax_mode` ("None" / "fast") and the recompute choice (`recompute_mode`, else `torch.hpu.sdp_kernel`'s setting)
are accepted and checked as on a Gaudi but change nothing in the numbers: "fast" is a Gaudi speed/accuracy trade and
recompute a memory trade (the probabilities are recomputed in backward instead of kept).
"""

from __future__ import annotations

import math
from typing import Any

import habana_frameworks.torch.hpu as ht
import torch
from habana_frameworks.torch.hpex.kernels import _sdpa_math
from habana_frameworks.torch.hpex.kernels._sdpa_math import Masking

__emulated__ = True


def is_gqa(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Grouped-query attention: 4-D q and k with different head counts, k having more than one head."""
    return q.dim() == 4 and q.shape[1] != k.shape[1] and k.shape[1] != 1


def gqa_input_reshape_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None):
    """Put each group's query heads next to its key/value head: q [B, G, H/G, T, D], k/v [B, G, 1, S, D]; a mask with
    H heads is grouped the same way, a mask with one head gets a group axis of 1."""
    batch, heads, q_len, dim = q.shape
    groups = k.shape[1]
    q = q.reshape(batch, groups, heads // groups, q_len, dim)
    k = k.reshape(k.shape[0], groups, 1, k.shape[2], k.shape[3])
    v = v.reshape(v.shape[0], groups, 1, v.shape[2], v.shape[3])
    if attn_mask is not None:
        attn_mask = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))  # a 2-D / 3-D mask
        mask_batch, mask_heads, mask_t, mask_s = attn_mask.shape
        if mask_heads == heads:
            attn_mask = attn_mask.reshape(mask_batch, groups, heads // groups, mask_t, mask_s)
        else:
            attn_mask = attn_mask.unsqueeze(1)
    return q, k, v, attn_mask


def gqa_output_reshape(tensor: torch.Tensor) -> torch.Tensor:
    """[B, G, H/G, ...] back to [B, H, ...]."""
    batch, groups, per_group, rows, cols = tensor.shape
    return tensor.reshape(batch, groups * per_group, rows, cols)


def _check_arguments(requires_backward: bool, attn_mask: torch.Tensor | None, is_causal: bool, softmax_mode: str,
                     recompute: bool, valid_seq_len: torch.Tensor | None, return_dropout_mask: bool) -> None:
    """Habana's checks after the recompute choice, in its order and with its messages."""
    if recompute and requires_backward and softmax_mode == "fast" and not is_causal:
        raise AssertionError(
            "Optimized softmax mode is supported in recompute training mode only in causal(triangular) mask case"
        )
    if valid_seq_len is not None and not (is_causal and not requires_backward and attn_mask is None):
        raise AssertionError(
            "Valid sequence length is supported only in inference with is_causal(triangular) mask case"
        )
    if recompute and return_dropout_mask:
        raise AssertionError("Return_dropout_mask is not supported in recompute mode")


SOFTMAX_MODES = ("none", "fast")  # the bridge's graph knows "fast"; its Python default is "None"


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None,
                  dropout_p: float, softmax_mode: str) -> None:
    """What the Gaudi op cannot mean, refused before computing (not Habana's asserts: its graph would take these and
    answer something else; the emulation refuses them as torch's scaled_dot_product_attention does, with its words).
    Masks are Habana's reference kinds (PySDPA / the bridge's SDPA tests): bool (True attends) or float (added)."""
    if softmax_mode not in SOFTMAX_MODES:
        raise ValueError(f"FusedSDPA: softmax_mode {softmax_mode!r} is not one of 'None' (exact softmax) or 'fast' "
                         "(Gaudi's faster approximation); the mode is case-insensitive.")
    if not 0.0 <= dropout_p <= 1.0:
        raise RuntimeError(f"FusedSDPA: dropout probability has to be between 0 and 1, but got {dropout_p}")
    if not all(t.is_floating_point() for t in (q, k, v)):
        raise RuntimeError(f"FusedSDPA: q, k and v must be floating point tensors, got {q.dtype}, {k.dtype} and "
                           f"{v.dtype} (integers would be truncated: convert them first).")
    if q.dim() == 4 and k.dim() == 4 and v.dim() == 4:
        q_heads, k_heads, v_heads = q.shape[1], k.shape[1], v.shape[1]
        if k_heads != v_heads:
            raise RuntimeError(f"FusedSDPA: k and v must have the same number of heads ({k_heads} and {v_heads}).")
        if k_heads != q_heads and (k_heads == 0 or q_heads % k_heads):
            raise RuntimeError(f"FusedSDPA: for grouped-query attention the query heads ({q_heads}) must be a "
                               f"multiple of the key/value heads ({k_heads}): each key/value head serves a group.")
    if attn_mask is None:
        return
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        raise RuntimeError(
            f"FusedSDPA: Expected attn_mask dtype to be bool or float, but got {attn_mask.dtype} (torch's "
            "scaled_dot_product_attention refuses it too). A 0/1 mask (as tokenizers return) would be added to the "
            "scores, not mask them: pass attn_mask.bool() (True attends), or an additive float mask (0 / -inf)."
        )
    scores = (*q.shape[:-1], k.shape[-2])
    try:
        fits = attn_mask.dim() <= len(scores) and torch.broadcast_shapes(attn_mask.shape, scores) == scores
    except RuntimeError:
        fits = False
    if not fits:
        raise RuntimeError(f"FusedSDPA: attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to the "
                           f"attention scores' shape {scores} ((batch, heads,) queries, keys).")


def _autocast_inputs(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Under torch.autocast("hpu"), floating q/k/v run in the autocast dtype (the Gaudi op is a lower-precision op)."""
    if not torch.is_autocast_enabled("hpu"):
        return list(tensors)
    dtype = torch.get_autocast_dtype("hpu")
    return [t.to(dtype) if t.is_floating_point() else t for t in tensors]


class FusedSDPA(torch.autograd.Function):
    """Fused scaled-dot-product attention with Gaudi's signature (see the module docstring)."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        softmax_mode: str = "None",
        recompute_mode: bool | None = None,
        valid_seq_len: torch.Tensor | None = None,
        seq_padding_type: str = "left",
        return_dropout_mask: bool = False,
        return_attn_probs: bool = False,
    ) -> Any:
        requires_backward = q.requires_grad or k.requires_grad or v.requires_grad
        softmax_mode = softmax_mode.lower()
        seq_padding_type = seq_padding_type.lower()
        if scale is None:
            scale = 1.0 / math.sqrt(q.size(-1))
        recompute = ht.recompute_sdp_enabled() if recompute_mode is None else bool(recompute_mode)
        if return_attn_probs:
            if requires_backward:
                raise AssertionError("return_attn_probs is supported only for inference mode")
            recompute = False
        _check_arguments(requires_backward, attn_mask, is_causal, softmax_mode, recompute, valid_seq_len,
                         return_dropout_mask)
        _check_inputs(q, k, v, attn_mask, dropout_p, softmax_mode)

        input_dtypes = (q.dtype, k.dtype, v.dtype)
        q, k, v = _autocast_inputs(q, k, v)
        gqa = is_gqa(q, k)
        if gqa:
            q, k, v, attn_mask = gqa_input_reshape_fwd(q, k, v, attn_mask)
        masking = Masking(attn_mask, is_causal, valid_seq_len, seq_padding_type)
        with torch.autocast("hpu", enabled=False):
            probs = _sdpa_math.attention_probs(q, k, scale, masking)
            keep = _sdpa_math.dropout_keep(probs, dropout_p)
            out = _sdpa_math.attention_output(probs, v, keep, dropout_p).to(q.dtype)
        if gqa:
            out = gqa_output_reshape(out)

        if requires_backward:
            ctx.save_for_backward(q, k, v, attn_mask, valid_seq_len, keep, None if recompute else probs)
            ctx.settings = (dropout_p, scale, is_causal, seq_padding_type, gqa, input_dtypes)
        extras = []
        if return_attn_probs:  # inference only (checked above)
            extras.append((gqa_output_reshape(probs) if gqa else probs).to(q.dtype))
        if return_dropout_mask:  # never in recompute mode (checked above)
            mask = torch.ones_like(probs, dtype=torch.int8) if keep is None else keep.to(torch.int8)
            extras.append(gqa_output_reshape(mask) if gqa else mask)
        if not extras:
            return out
        ctx.mark_non_differentiable(*extras)
        return (out, *extras)

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor, *unused: Any) -> tuple[torch.Tensor | None, ...]:
        q, k, v, attn_mask, valid_seq_len, keep, probs = ctx.saved_tensors
        dropout_p, scale, is_causal, seq_padding_type, gqa, input_dtypes = ctx.settings
        if gqa:
            dout = dout.reshape(q.shape[:-1] + (v.shape[-1],))
        with torch.autocast("hpu", enabled=False):
            if probs is None:  # recompute mode: the probabilities were not kept
                probs = _sdpa_math.attention_probs(q, k, scale, Masking(attn_mask, is_causal, valid_seq_len,
                                                                         seq_padding_type))
            dq, dk, dv = _sdpa_math.attention_grads(dout, q, k, v, probs, keep, dropout_p, scale)
        if gqa:
            dq, dk, dv = gqa_output_reshape(dq), gqa_output_reshape(dk), gqa_output_reshape(dv)
        dq, dk, dv = (grad.to(dtype) for grad, dtype in zip((dq, dk, dv), input_dtypes))
        return (dq, dk, dv) + (None,) * 10

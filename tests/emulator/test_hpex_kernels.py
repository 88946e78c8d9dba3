"""Habana's hpex kernels and normalization on the emulated Gaudi, against pure-torch references (forward and backward).

Called as Gaudi code calls them (optimum-habana's LLaMA: `FusedSDPA.apply(...)` positionally inside
`ht.sdp_kernel(...)`, `FusedRoPE.apply(q, cos.unsqueeze(0).unsqueeze(0), sin..., position_ids)`,
`FusedRMSNorm.apply(x, weight, eps)`, its trainer's `FusedClipNorm(...).clip_norm(...)`, wav2vec2's `CTCLoss.apply`),
on `hpu` tensors; the references run on the CPU with torch's own ops.
"""

from __future__ import annotations

import copy

import habana_frameworks.torch.hpu as ht
import pytest
import torch
import torch.nn.functional as F
from habana_frameworks.torch.hpex.kernels import (
    CTCLoss,
    FusedSDPA,
    RotaryPosEmbeddingHelperV1,
    RotaryPosEmbeddingHelperV2,
    RotaryPosEmbeddingHelperV3,
    RotaryPosEmbeddingMode,
    apply_rotary_pos_emb,
)
from habana_frameworks.torch.hpex.normalization import FusedClipNorm, FusedRMSNorm

HPU = torch.device("hpu")
TOL = {"atol": 1e-5, "rtol": 1e-5}


def on_hpu(*tensors: torch.Tensor, grad: bool = True) -> list[torch.Tensor]:
    """Leaf copies on the device (requiring grad when asked), as Gaudi code gets them."""
    return [t.detach().to(HPU).requires_grad_(grad and t.is_floating_point()) for t in tensors]


def leaves(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.detach().clone().requires_grad_() for t in tensors]


def assert_grads_match(device_leaves: list[torch.Tensor], cpu_leaves: list[torch.Tensor], **tol: float) -> None:
    for got, want in zip(device_leaves, cpu_leaves):
        assert got.grad is not None and got.grad.device.type == "hpu"
        torch.testing.assert_close(got.grad.cpu(), want.grad, **(tol or TOL))


# -- FusedSDPA -------------------------------------------------------------------------------------------------------
def sdpa(q, k, v, mask=None, dropout_p=0.0, is_causal=False, scale=None, softmax_mode="None", recompute=None,
         valid_seq_len=None, padding="left", return_dropout_mask=False, return_attn_probs=False):
    """FusedSDPA called positionally, as every caller must (autograd Functions take no keywords)."""
    return FusedSDPA.apply(q, k, v, mask, dropout_p, is_causal, scale, softmax_mode, recompute, valid_seq_len, padding,
                           return_dropout_mask, return_attn_probs)


def torch_sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    gqa = q.dim() == 4 and q.shape[1] != k.shape[1]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=gqa)


SDPA_CASES = {
    # name: (q shape, k shape, v shape, mask kind, is_causal, scale)
    "plain": ((2, 4, 6, 8), (2, 4, 6, 8), (2, 4, 6, 8), None, False, None),
    "causal": ((2, 4, 6, 8), (2, 4, 6, 8), (2, 4, 6, 8), None, True, None),
    "causal-cross-lengths": ((2, 3, 5, 8), (2, 3, 9, 8), (2, 3, 9, 4), None, True, None),
    "bool-mask": ((2, 4, 6, 8), (2, 4, 7, 8), (2, 4, 7, 8), "bool", False, None),
    "float-mask-per-head": ((2, 4, 6, 8), (2, 4, 7, 8), (2, 4, 7, 8), "float-heads", False, None),
    "scale": ((2, 4, 6, 8), (2, 4, 6, 8), (2, 4, 6, 8), None, False, 0.3),
    "gqa-causal": ((2, 8, 6, 8), (2, 2, 6, 8), (2, 2, 6, 8), None, True, None),
    "gqa-mask": ((2, 6, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8), "float", False, 0.5),
    "gqa-mask-per-head": ((2, 6, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8), "float-heads", False, None),
    "mqa": ((2, 4, 6, 8), (2, 1, 6, 8), (2, 1, 6, 8), None, True, None),
    "3d": ((3, 6, 8), (3, 7, 8), (3, 7, 5), "bool3d", False, None),
}


def make_mask(kind, q_shape, k_shape):
    batch, q_len, k_len = q_shape[0], q_shape[-2], k_shape[-2]
    if kind is None:
        return None
    if kind == "bool3d":
        keep = torch.rand(batch, q_len, k_len) > 0.3
        keep[..., 0] = True
        return keep
    heads = q_shape[1] if kind == "float-heads" else 1
    keep = torch.rand(batch, heads, q_len if heads > 1 else 1, k_len) > 0.3
    keep[..., 0] = True  # every query sees at least one key
    if kind == "bool":
        return keep
    return torch.zeros(keep.shape).masked_fill(~keep, -1e9) + 0.1 * torch.randn(keep.shape)


@pytest.mark.parametrize("recompute", [False, True], ids=["keep-probs", "recompute"])
@pytest.mark.parametrize("case", list(SDPA_CASES))
def test_fused_sdpa_matches_torch_forward_and_backward(case, recompute):
    torch.manual_seed(0)
    q_shape, k_shape, v_shape, mask_kind, is_causal, scale = SDPA_CASES[case]
    q, k, v = torch.randn(q_shape), torch.randn(k_shape), torch.randn(v_shape)
    mask = make_mask(mask_kind, q_shape, k_shape)
    dq, dk, dv = on_hpu(q, k, v)
    cq, ck, cv = leaves(q, k, v)

    out = sdpa(dq, dk, dv, None if mask is None else mask.to(HPU), 0.0, is_causal, scale, "None", recompute)
    want = torch_sdpa(cq, ck, cv, mask, is_causal, scale)
    assert out.device.type == "hpu" and out.shape == want.shape and out.dtype == torch.float32
    torch.testing.assert_close(out.cpu(), want.detach(), **TOL)

    grad = torch.randn(want.shape)
    out.backward(grad.to(HPU))
    want.backward(grad)
    assert_grads_match([dq, dk, dv], [cq, ck, cv])


def test_a_mask_with_is_causal_applies_both():
    torch.manual_seed(19)
    q, k, v = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    keep = torch.rand(2, 1, 5, 5) > 0.4
    keep[..., 0] = True
    with torch.no_grad():
        out = sdpa(q.to(HPU), k.to(HPU), v.to(HPU), keep.to(HPU), 0.0, True)
    both = keep & torch.ones(5, 5, dtype=torch.bool).tril()
    torch.testing.assert_close(out.cpu(), torch_sdpa(q, k, v, both), **TOL)


def test_fused_sdpa_as_optimum_habana_llama_calls_it():
    """First token: causal, recompute from the model's flag, valid lengths None; next token: one query, a mask."""
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 8, 5, 16), torch.randn(2, 2, 5, 16), torch.randn(2, 2, 5, 16)
    dq, dk, dv = on_hpu(q, k, v)
    cq, ck, cv = leaves(q, k, v)
    with ht.sdp_kernel(enable_recompute=True):
        first = FusedSDPA.apply(dq, dk, dv, None, 0.0, True, None, "fast", True, None, "left")
    want = torch_sdpa(cq, ck, cv, None, True)
    torch.testing.assert_close(first.cpu(), want.detach(), **TOL)
    first.sum().backward()
    want.sum().backward()
    assert_grads_match([dq, dk, dv], [cq, ck, cv])

    mask = torch.zeros(2, 1, 1, 5)
    mask[0, ..., :2] = torch.finfo(torch.float32).min  # left padding of the first sequence
    with torch.no_grad():
        step = FusedSDPA.apply(q[:, :, -1:].to(HPU), k.to(HPU), v.to(HPU), mask.to(HPU), 0.0, False, None, "None",
                               False, None, "None")
        want = torch_sdpa(q[:, :, -1:], k, v, mask)
    torch.testing.assert_close(step.cpu(), want, **TOL)


def test_recompute_is_a_memory_choice_only_and_sdp_kernel_restores_the_setting():
    torch.manual_seed(2)
    q, k, v = torch.randn(3, 2, 4, 8), torch.randn(3, 2, 4, 8), torch.randn(3, 2, 4, 8)
    assert ht.recompute_sdp_enabled() is True  # Habana's default
    grads = []
    for enable in (True, False):
        with ht.sdp_kernel(enable_recompute=enable) as context:
            assert context == {} and ht.recompute_sdp_enabled() is enable
            dq, dk, dv = on_hpu(q, k, v)
            sdpa(dq, dk, dv, None, 0.0, True).pow(2).sum().backward()
            grads.append([t.grad.cpu() for t in (dq, dk, dv)])
        assert ht.recompute_sdp_enabled() is True
    for with_recompute, without in zip(*grads):
        torch.testing.assert_close(with_recompute, without, atol=0, rtol=0)
    assert torch.hpu.sdp_kernel is ht.sdp_kernel  # torch.hpu is Habana's module


def test_bfloat16_inputs_give_bfloat16_output_close_to_the_float32_reference():
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 4, 6, 8).bfloat16() for _ in range(3))
    dq, dk, dv = on_hpu(q, k, v)
    out = sdpa(dq, dk, dv, None, 0.0, True)
    want = torch_sdpa(q.float(), k.float(), v.float(), None, True)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.cpu().float(), want, atol=2e-2, rtol=2e-2)
    out.float().sum().backward()
    assert dq.grad.dtype == torch.bfloat16 and torch.isfinite(dq.grad.cpu().float()).all()


def test_under_hpu_autocast_fused_sdpa_runs_in_the_autocast_dtype():
    torch.manual_seed(4)
    q, k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)
    dq, dk, dv = on_hpu(q, k, v)
    with torch.autocast("hpu", dtype=torch.bfloat16):
        out = sdpa(dq, dk, dv, None, 0.0, True)
    want = torch_sdpa(q.bfloat16().float(), k.bfloat16().float(), v.bfloat16().float(), None, True)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.cpu().float(), want, atol=1e-2, rtol=1e-2)
    out.float().sum().backward()
    assert dq.grad.dtype == torch.float32  # gradients come back in the leaves' dtype


def test_dropout_zero_is_deterministic_and_equal_to_no_dropout():
    torch.manual_seed(5)
    q, k, v = (t.to(HPU) for t in (torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)))
    with torch.no_grad():
        first, second = sdpa(q, k, v, None, 0.0, True), sdpa(q, k, v, None, 0.0, True)
        reference = torch_sdpa(q.cpu(), k.cpu(), v.cpu(), None, True)
    assert torch.equal(first.cpu(), second.cpu())
    torch.testing.assert_close(first.cpu(), reference, **TOL)


def test_dropout_keeps_one_minus_p_of_the_weights_and_rescales_them():
    """q = k = 0 gives uniform weights 1/S; with v = 1 each output is (kept weights) / S / (1 - p): its mean is 1."""
    torch.manual_seed(6)
    p, keys = 0.25, 64
    q, k = torch.zeros(4, 4, 64, 8, device=HPU), torch.zeros(4, 4, keys, 8, device=HPU)
    v = torch.ones(4, 4, keys, 8, device=HPU)
    with torch.no_grad():
        out, mask = sdpa(q, k, v, None, p, False, None, "None", False, None, "left", True)
    assert out.shape == (4, 4, 64, 8) and mask.shape == (4, 4, 64, keys) and mask.dtype == torch.int8
    kept = mask.cpu().float()
    assert abs(1 - kept.mean().item() - p) < 0.02  # 65536 Bernoulli draws: 0.02 is > 10 standard deviations
    torch.testing.assert_close(out.cpu()[..., 0], kept.sum(-1) / keys / (1 - p), **TOL)
    assert abs(out.cpu().mean().item() - 1.0) < 0.02
    again = sdpa(q, k, v, None, p, False)
    assert not torch.equal(again.cpu(), out.cpu())  # a fresh mask per call


def test_dropout_backward_uses_the_forward_mask():
    """Training without recompute can return the dropout mask: the gradients equal autograd through that mask."""
    torch.manual_seed(7)
    p = 0.3
    q, k, v = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 4)
    dq, dk, dv = on_hpu(q, k, v)
    out, mask = sdpa(dq, dk, dv, None, p, True, None, "None", False, None, "left", True)
    cq, ck, cv = leaves(q, k, v)
    scores = (cq @ ck.transpose(-2, -1)) / 8 ** 0.5
    scores = scores.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
    want = (torch.softmax(scores, -1) * mask.cpu().float() / (1 - p)) @ cv
    torch.testing.assert_close(out.detach().cpu(), want.detach(), **TOL)
    grad = torch.randn(want.shape)
    out.backward(grad.to(HPU))
    want.backward(grad)
    assert_grads_match([dq, dk, dv], [cq, ck, cv])


def test_dropout_in_recompute_mode_as_model_references_bert_calls_it():
    """`FusedSDPA.apply(q, k, v, attention_mask, dropout_prob)` (recompute on by default): v = identity makes the output
    show the dropped weights, and the gradient of v must come from the same mask (dv[s] = sum over queries t)."""
    torch.manual_seed(20)
    p, seq = 0.4, 16
    q, k = torch.zeros(2, 2, seq, 8, device=HPU), torch.zeros(2, 2, seq, 8, device=HPU)
    (v,) = on_hpu(torch.eye(seq).expand(2, 2, seq, seq))
    extended_mask = torch.zeros(2, 1, 1, seq, device=HPU)  # BERT's additive mask, nothing hidden
    assert ht.recompute_sdp_enabled()
    out = FusedSDPA.apply(q, k, v, extended_mask, p)
    weights = out.detach().cpu()
    assert set(torch.unique(weights * seq * (1 - p)).round().tolist()) == {0.0, 1.0}
    out.sum().backward()
    torch.testing.assert_close(v.grad.cpu(), weights.sum(-2).unsqueeze(-1).expand(2, 2, seq, seq), **TOL)


def test_attention_probabilities_in_inference_with_grouped_heads():
    torch.manual_seed(8)
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    with torch.no_grad():
        out, probs = sdpa(q.to(HPU), k.to(HPU), v.to(HPU), None, 0.0, True, None, "None", None, None, "left", False,
                          True)
    scores = (q @ k.repeat_interleave(2, dim=1).transpose(-2, -1)) / 8 ** 0.5
    scores = scores.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(probs.cpu(), torch.softmax(scores, -1), **TOL)
    torch.testing.assert_close(out.cpu(), torch_sdpa(q, k, v, None, True), **TOL)


@pytest.mark.parametrize("padding", ["left", "right"])
def test_valid_sequence_lengths_hide_the_padded_keys(padding):
    torch.manual_seed(9)
    batch, heads, seq, dim = 3, 2, 6, 8
    q, k, v = torch.randn(batch, heads, seq, dim), torch.randn(batch, heads, seq, dim), torch.randn(batch, heads, seq,
                                                                                                   dim)
    lengths = torch.tensor([6, 4, 2])
    with torch.no_grad():
        out = sdpa(q.to(HPU), k.to(HPU), v.to(HPU), None, 0.0, True, None, "None", False, lengths.to(HPU), padding)
    positions = torch.arange(seq)
    for b, length in enumerate(lengths.tolist()):
        valid = positions >= seq - length if padding == "left" else positions < length
        keep = torch.ones(seq, seq, dtype=torch.bool).tril() & valid
        rows = keep.any(-1)
        want = torch_sdpa(q[b:b + 1, :, rows], k[b:b + 1], v[b:b + 1], keep[rows])
        torch.testing.assert_close(out[b:b + 1, :, rows].cpu(), want, **TOL)
        assert torch.equal(out[b, :, ~rows].cpu(), torch.zeros(heads, int((~rows).sum()), dim))  # sees no key


def _grad_inputs():
    return on_hpu(torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8))


@pytest.mark.parametrize("call, message", [
    (lambda q, k, v: sdpa(q, k, v, None, 0.0, True, None, "None", None, None, "left", False, True),
     "return_attn_probs is supported only for inference mode"),
    (lambda q, k, v: sdpa(q, k, v, None, 0.0, False, None, "fast", True),
     "Optimized softmax mode is supported in recompute training mode only in causal"),
    (lambda q, k, v: sdpa(q, k, v, None, 0.0, True, None, "None", False, torch.tensor([4], device=HPU)),
     "Valid sequence length is supported only in inference with is_causal"),
    (lambda q, k, v: sdpa(q.detach(), k.detach(), v.detach(), None, 0.0, False, None, "None", False,
                          torch.tensor([4], device=HPU)),
     "Valid sequence length is supported only in inference with is_causal"),
    (lambda q, k, v: sdpa(q, k, v, None, 0.1, True, None, "None", True, None, "left", True),
     "Return_dropout_mask is not supported in recompute mode"),
], ids=["probs-in-training", "fast-softmax-not-causal", "valid-len-in-training", "valid-len-not-causal",
        "dropout-mask-with-recompute"])
def test_fused_sdpa_refuses_what_habana_refuses(call, message):
    with pytest.raises(AssertionError, match=message):
        call(*_grad_inputs())


def test_fused_sdpa_other_refusals():
    q, k, v = _grad_inputs()
    with pytest.raises(AttributeError):  # Habana lower()s softmax_mode: it must be a string ("None", not None)
        sdpa(q, k, v, None, 0.0, True, None, None)
    with pytest.raises(TypeError):  # an autograd Function takes its arguments by position only
        FusedSDPA.apply(q, k, v, is_causal=True)
    q6, k4 = on_hpu(torch.randn(1, 6, 4, 8), torch.randn(1, 4, 4, 8))
    with pytest.raises(RuntimeError):  # query heads must be a multiple of the key/value heads
        sdpa(q6, k4, k4, None, 0.0, True)
    # fast softmax in training is fine with the causal mask, and gives the same numbers here
    torch.testing.assert_close(sdpa(q, k, v, None, 0.0, True, None, "fast", True).detach().cpu(),
                               sdpa(q, k, v, None, 0.0, True, None, "None", True).detach().cpu(), atol=0, rtol=0)


# Issue 28 item 5: what the emulated kernels accepted and should refuse (each a silently wrong answer before).
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_fused_sdpa_refuses_an_integer_mask_as_torch_does(dtype):
    """A tokenizer's 0/1 mask was added to the scores (off by 0.65) instead of masking; torch refuses it."""
    q, k, v = on_hpu(torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), grad=False)
    mask = torch.tensor([1, 1, 1, 0], dtype=dtype).expand(1, 1, 4, 4).to(HPU)
    with pytest.raises(RuntimeError, match="attn_mask dtype to be bool or float") as info:
        sdpa(q, k, v, mask)
    assert "bool()" in str(info.value)  # says how to pass a 0/1 mask
    with pytest.raises(RuntimeError, match="attn_mask dtype to be bool or float"):
        torch_sdpa(q.cpu(), k.cpu(), v.cpu(), mask.cpu())
    bool_mask = sdpa(q, k, v, mask.bool())  # what the user meant
    torch.testing.assert_close(bool_mask.cpu(), torch_sdpa(q.cpu(), k.cpu(), v.cpu(), mask.cpu().bool()), **TOL)


@pytest.mark.parametrize("shape", [(1, 1, 1, 4, 4), (1, 3, 4, 4), (2, 1, 4, 4), (1, 1, 4, 5)],
                         ids=["5d", "three-heads-of-two", "batch-two-of-one", "five-keys-of-four"])
@pytest.mark.parametrize("gqa", [False, True], ids=["mha", "gqa"])
def test_fused_sdpa_refuses_a_mask_that_does_not_fit_the_scores(shape, gqa):
    """A 5-D mask gave a 5-D output; a mask that does not broadcast to (batch, heads, queries, keys) is refused."""
    q_heads = 4 if gqa else 2
    q, k, v = on_hpu(torch.randn(1, q_heads, 4, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), grad=False)
    with pytest.raises(RuntimeError, match="does not broadcast to the attention scores"):
        sdpa(q, k, v, torch.ones(shape, dtype=torch.bool, device=HPU))


@pytest.mark.parametrize("shape", [(4, 4), (1, 4, 4), (1, 4)])
@pytest.mark.parametrize("gqa", [False, True], ids=["mha", "gqa"])
def test_fused_sdpa_lower_rank_masks_broadcast_as_torchs(shape, gqa):
    torch.manual_seed(3)
    q_heads = 4 if gqa else 2
    q, k, v = torch.randn(1, q_heads, 4, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    mask = torch.rand(shape) > 0.3
    mask[..., 0] = True
    got = sdpa(*on_hpu(q, k, v, grad=False), mask.to(HPU))
    torch.testing.assert_close(got.cpu(), torch_sdpa(q, k, v, mask), **TOL)


def test_fused_sdpa_grouped_heads_that_do_not_divide_are_a_clear_error():
    q6, k4, v2 = on_hpu(torch.randn(1, 6, 4, 8), torch.randn(1, 4, 4, 8), torch.randn(1, 2, 4, 8))
    with pytest.raises(RuntimeError, match=r"query heads \(6\) must be a multiple of the key/value heads \(4\)"):
        sdpa(q6, k4, k4)
    with pytest.raises(RuntimeError, match=r"k and v must have the same number of heads \(4 and 2\)"):
        sdpa(q6, k4, v2)


@pytest.mark.parametrize("dropout_p", [-0.1, 1.5, float("nan")])
def test_fused_sdpa_refuses_a_dropout_probability_outside_0_1(dropout_p):
    q, k, v = _grad_inputs()
    with pytest.raises(RuntimeError, match="dropout probability has to be between 0 and 1"):
        sdpa(q, k, v, None, dropout_p)


def test_fused_sdpa_refuses_an_unknown_softmax_mode():
    q, k, v = _grad_inputs()
    with pytest.raises(ValueError, match="softmax_mode 'bogus'.*'None'.*'fast'"):
        sdpa(q, k, v, None, 0.0, True, None, "bogus")
    sdpa(q, k, v, None, 0.0, True, None, "FAST", True)  # Habana lower()s it: any case is fine


def test_fused_sdpa_refuses_integer_q_k_v():
    """They came back truncated to zeros."""
    q = torch.randint(-3, 3, (1, 2, 4, 8)).to(HPU)
    with pytest.raises(RuntimeError, match="floating point"):
        sdpa(q, q, q)
    with pytest.raises(RuntimeError, match="floating point"):
        sdpa(q.float(), q.float(), q)


# -- rotary position embedding ----------------------------------------------------------------------------------------
def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate_every_two(x):
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def rope_table(positions, dim, pairwise=False):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    freqs = torch.outer(torch.arange(positions).float(), inv_freq)
    emb = freqs.repeat_interleave(2, dim=-1) if pairwise else torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def check_rope(device_out, device_p, reference_fn, p):
    cp = leaves(p)[0]
    want = reference_fn(cp)
    torch.testing.assert_close(device_out.detach().cpu(), want.detach(), **TOL)
    grad = torch.randn(want.shape)
    device_out.backward(grad.to(HPU))
    want.backward(grad)
    assert_grads_match([device_p], [cp])


def test_rope_v2_as_optimum_habana_llama_calls_it():
    torch.manual_seed(10)
    batch, heads, seq, dim = 2, 4, 5, 16
    cos, sin = rope_table(32, dim)
    position_ids = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    q = torch.randn(batch, heads, seq, dim)
    (dq,) = on_hpu(q)
    out = RotaryPosEmbeddingHelperV2.apply(dq, cos.to(HPU).unsqueeze(0).unsqueeze(0),
                                           sin.to(HPU).unsqueeze(0).unsqueeze(0), position_ids.to(HPU))
    check_rope(out, dq, lambda x: x * cos[position_ids].unsqueeze(1) + rotate_half(x) * sin[position_ids].unsqueeze(1),
               q)


def test_rope_v2_with_gathered_cos_and_no_position_ids():
    """Qwen2.5-VL's form: cos/sin already per token ([B, 1, T, D]), position_ids None."""
    torch.manual_seed(11)
    q = torch.randn(2, 3, 4, 8)
    cos, sin = torch.randn(2, 1, 4, 8), torch.randn(2, 1, 4, 8)
    (dq,) = on_hpu(q)
    out = RotaryPosEmbeddingHelperV2.apply(dq, cos.to(HPU), sin.to(HPU), None)
    check_rope(out, dq, lambda x: x * cos + rotate_half(x) * sin, q)


@pytest.mark.parametrize("offset", [0, 3])
def test_rope_v1_offset_selects_where_cos_and_sin_start(offset):
    """GPT-NeoX <= 4.27.4: cos/sin of the last dim start at `offset` (the bridge's V1 reference)."""
    torch.manual_seed(12)
    q = torch.randn(6, 4, 8)
    cos, sin = torch.randn(6, 1, offset + 8), torch.randn(6, 1, offset + 8)
    (dq,) = on_hpu(q)
    out = RotaryPosEmbeddingHelperV1.apply(dq, cos.to(HPU), sin.to(HPU), offset)
    window = slice(offset, offset + 8)
    check_rope(out, dq, lambda x: x * cos[..., window] + rotate_half(x) * sin[..., window], q)


def test_rope_pairwise_is_rotate_every_two():
    """GPT-J's form through apply_rotary_pos_emb(p, cos, sin, None, 0, PAIRWISE); differentiable too."""
    torch.manual_seed(13)
    p = torch.randn(2, 6, 3, 8)
    cos, sin = (t.unsqueeze(0).unsqueeze(2) for t in rope_table(6, 8, pairwise=True))
    (dp,) = on_hpu(p)
    out = apply_rotary_pos_emb(dp, cos.to(HPU), sin.to(HPU), None, 0, RotaryPosEmbeddingMode.PAIRWISE)
    check_rope(out, dp, lambda x: x * cos + rotate_every_two(x) * sin, p)


def test_rope_blockwise_and_pairwise_differ():
    p = torch.randn(1, 2, 3, 8, device=HPU)
    cos, sin = torch.randn(1, 1, 3, 8, device=HPU), torch.randn(1, 1, 3, 8, device=HPU)
    blockwise = apply_rotary_pos_emb(p, cos, sin, None, 0, RotaryPosEmbeddingMode.BLOCKWISE)
    pairwise = apply_rotary_pos_emb(p, cos, sin, None, 0, RotaryPosEmbeddingMode.PAIRWISE)
    assert not torch.allclose(blockwise.cpu(), pairwise.cpu())
    torch.testing.assert_close(apply_rotary_pos_emb(p, cos, sin).cpu(), blockwise.cpu(), atol=0, rtol=0)


@pytest.mark.parametrize("rotary_half_dim", [4, 2], ids=["all-rotated", "half-passed-through"])
def test_rope_v3_chatglm_rope_cache(rotary_half_dim):
    torch.manual_seed(14)
    seq, batch, heads, dim = 5, 2, 3, 8
    p = torch.randn(seq, batch, heads, dim)
    rope_cache = torch.stack((torch.randn(9, rotary_half_dim), torch.randn(9, rotary_half_dim)), dim=-1)

    def chatglm(x):
        rot = rotary_half_dim * 2
        rotated, passed = x[..., :rot], x[..., rot:]
        pairs = rotated.reshape(seq, -1, heads, rot // 2, 2)
        cache = rope_cache[:seq].view(seq, -1, 1, rot // 2, 2)
        out = torch.stack((pairs[..., 0] * cache[..., 0] - pairs[..., 1] * cache[..., 1],
                           pairs[..., 1] * cache[..., 0] + pairs[..., 0] * cache[..., 1]), -1).flatten(3)
        return torch.cat((out, passed), dim=-1)

    (dp,) = on_hpu(p)
    check_rope(RotaryPosEmbeddingHelperV3.apply(dp, rope_cache.to(HPU)), dp, chatglm, p)
    with torch.no_grad():
        torch.testing.assert_close(apply_rotary_pos_emb(p.to(HPU), rope_cache.to(HPU)).cpu(), chatglm(p), **TOL)


def test_rope_dtypes_follow_habana_rule():
    p = torch.randn(1, 2, 3, 8, device=HPU).bfloat16()
    cos, sin = torch.randn(1, 1, 3, 8, device=HPU), torch.randn(1, 1, 3, 8, device=HPU)
    assert RotaryPosEmbeddingHelperV2.apply(p, cos, sin, None).dtype == torch.float32  # any float32 wins
    assert RotaryPosEmbeddingHelperV2.apply(p, cos.bfloat16(), sin.half(), None).dtype == torch.bfloat16
    (leaf,) = on_hpu(torch.randn(1, 2, 3, 8).bfloat16())
    RotaryPosEmbeddingHelperV2.apply(leaf, cos, sin, None).sum().backward()
    assert leaf.grad.dtype == torch.bfloat16


def test_rope_refuses_a_plain_int_mode():
    p, cos = torch.randn(1, 1, 2, 4, device=HPU), torch.randn(1, 1, 2, 4, device=HPU)
    with pytest.raises(AttributeError):  # Habana passes mode.value to its op
        apply_rotary_pos_emb(p, cos, cos, None, 0, 1)


# -- FusedRMSNorm ------------------------------------------------------------------------------------------------------
def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


@pytest.mark.parametrize("shape, eps", [((4, 7, 32), 1e-6), ((2, 3, 5, 16), 3e-5)])
def test_fused_rms_norm_matches_the_llama_formula(shape, eps):
    torch.manual_seed(15)
    x, weight = torch.randn(shape), torch.rand(shape[-1]) + 0.5
    dx, dw = on_hpu(x, weight)
    cx, cw = leaves(x, weight)
    out = FusedRMSNorm.apply(dx, dw, eps)
    want = rms_norm(cx, cw, eps)
    torch.testing.assert_close(out.detach().cpu(), want.detach(), **TOL)
    grad = torch.randn(shape)
    out.backward(grad.to(HPU))
    want.backward(grad)
    assert_grads_match([dx, dw], [cx, cw], atol=1e-4, rtol=1e-4)


def test_fused_rms_norm_dtypes_and_extra_arguments():
    torch.manual_seed(16)
    x, weight = torch.randn(3, 16), torch.rand(16)
    mixed = FusedRMSNorm.apply(x.bfloat16().to(HPU), weight.to(HPU), 1e-6)
    assert mixed.dtype == torch.float32  # different dtypes: the Gaudi op answers in float32
    same = FusedRMSNorm.apply(x.bfloat16().to(HPU), weight.bfloat16().to(HPU), 1e-6)
    assert same.dtype == torch.bfloat16
    torch.testing.assert_close(same.cpu().float(), rms_norm(x.bfloat16().float(), weight.bfloat16().float(), 1e-6),
                               atol=2e-2, rtol=2e-2)
    plain = FusedRMSNorm.apply(x.to(HPU), weight.to(HPU), 1e-6)
    tuned = FusedRMSNorm.apply(x.to(HPU), weight.to(HPU), 1e-6, False, 1, True)  # use_stages, bwd_mode, fast_math
    torch.testing.assert_close(tuned.cpu(), plain.cpu(), atol=0, rtol=0)
    with pytest.raises(RuntimeError):  # gamma must match the normalised dimension
        FusedRMSNorm.apply(x.to(HPU), torch.rand(8, device=HPU), 1e-6)


def test_fused_rms_norm_refuses_integer_input():
    """An integer input came back truncated to zeros."""
    with pytest.raises(RuntimeError, match="floating point"):
        FusedRMSNorm.apply(torch.randint(0, 5, (3, 16)).to(HPU), torch.rand(16, device=HPU), 1e-6)
    with pytest.raises(RuntimeError, match="floating point"):
        FusedRMSNorm.apply(torch.rand(3, 16, device=HPU), torch.ones(16, dtype=torch.int64, device=HPU), 1e-6)


@pytest.mark.parametrize("mode", [RotaryPosEmbeddingMode.BLOCKWISE, RotaryPosEmbeddingMode.PAIRWISE])
def test_rope_refuses_an_odd_head_dim(mode):
    """BLOCKWISE silently differed from rotate-half; PAIRWISE failed with a raw `stack` error."""
    p = torch.randn(1, 2, 4, 5).to(HPU)
    cos, sin = (t.to(HPU) for t in rope_table(4, 6))
    cos, sin = cos[:, :5], sin[:, :5]
    with pytest.raises(RuntimeError, match=r"head dim .*even.* got 5"):
        apply_rotary_pos_emb(p, cos, sin, None, 0, mode)
    if mode is RotaryPosEmbeddingMode.BLOCKWISE:
        with pytest.raises(RuntimeError, match=r"head dim .*even.* got 5"):
            RotaryPosEmbeddingHelperV2.apply(p, cos, sin, None)


# -- FusedClipNorm -----------------------------------------------------------------------------------------------------
def model_with_grads(scale: float):
    torch.manual_seed(17)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    device_model = copy.deepcopy(model).to(HPU)
    x = torch.randn(8, 16)
    (model(x).sum() * scale).backward()
    (device_model(x.to(HPU)).sum() * scale).backward()
    return model, device_model


@pytest.mark.parametrize("scale", [10.0, 1e-3], ids=["clipped", "under-the-limit"])
def test_fused_clip_norm_equals_clip_grad_norm(scale):
    model, device_model = model_with_grads(scale)
    clipper = FusedClipNorm(device_model.parameters(), 1.0)  # as optimum-habana's GaudiTrainer builds it
    norm = clipper.clip_norm(device_model.parameters())
    want = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    assert norm.device.type == "hpu" and norm.shape == (1,) and norm.dtype == torch.float32
    torch.testing.assert_close(norm.cpu()[0], want, **TOL)
    assert (want > 1.0) == (scale > 1)
    for got, expected in zip(device_model.parameters(), model.parameters()):
        torch.testing.assert_close(got.grad.cpu(), expected.grad, **TOL)


def test_fused_clip_norm_without_gradients_and_its_refusal():
    model = torch.nn.Linear(4, 2).to(HPU)
    clipper = FusedClipNorm(model.parameters(), 1.0)
    assert torch.equal(clipper.clip_norm(model.parameters()), torch.tensor(0.0))
    model(torch.randn(3, 4, device=HPU)).sum().backward()
    single = clipper.clip_norm(model.weight)  # one tensor is accepted too
    assert single.shape == (1,)
    clipper.norm_type = 1.0
    with pytest.raises(RuntimeError, match="unsupported norm_type"):
        clipper.clip_norm(model.parameters())


# -- CTCLoss -----------------------------------------------------------------------------------------------------------
def ctc_inputs():
    torch.manual_seed(18)
    time, batch, classes = 12, 3, 6
    log_probs = torch.randn(time, batch, classes).log_softmax(-1)
    target_lengths = torch.tensor([4, 2, 3])
    targets = torch.randint(1, classes, (int(target_lengths.sum()),))  # concatenated, as wav2vec2 flattens them
    input_lengths = torch.tensor([12, 10, 11])
    return log_probs, targets, input_lengths, target_lengths


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_ctc_loss_matches_torch(reduction):
    log_probs, targets, input_lengths, target_lengths = ctc_inputs()
    (dlp,) = on_hpu(log_probs)
    (clp,) = leaves(log_probs)
    loss = CTCLoss.apply(dlp, targets.to(HPU), input_lengths.to(HPU), target_lengths.to(HPU), 0, reduction, False)
    want = F.ctc_loss(clp, targets, input_lengths, target_lengths, blank=0, reduction=reduction)
    torch.testing.assert_close(loss.detach().cpu(), want.detach(), **TOL)
    grad = torch.rand(want.shape) + 0.5
    loss.backward(grad.to(HPU))
    want.backward(grad)
    assert_grads_match([dlp], [clp], atol=1e-5, rtol=1e-4)


def test_ctc_loss_zero_infinity_and_refusals():
    log_probs, targets, input_lengths, target_lengths = ctc_inputs()
    short = torch.tensor([12, 1, 11])  # sample 1 cannot emit its 2 targets in 1 step: infinite loss
    (dlp,) = on_hpu(log_probs)
    args = (targets.to(HPU), short.to(HPU), target_lengths.to(HPU), 0, "sum")
    assert torch.isinf(CTCLoss.apply(dlp, *args, False).detach().cpu())
    loss = CTCLoss.apply(dlp, *args, True)
    (clp,) = leaves(log_probs)
    want = F.ctc_loss(clp, targets, short, target_lengths, reduction="sum", zero_infinity=True)
    torch.testing.assert_close(loss.detach().cpu(), want.detach(), **TOL)
    loss.backward()
    want.backward()
    assert_grads_match([dlp], [clp], atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="is not a valid value for reduction"):
        CTCLoss.apply(dlp, targets.to(HPU), input_lengths.to(HPU), target_lengths.to(HPU), 0, "average", False)
    with pytest.raises(TypeError, match="input_lengths must be a tensor"):
        CTCLoss.apply(dlp, targets.to(HPU), [12, 10, 11], target_lengths.to(HPU), 0, "mean", False)


# -- torch.hpu autocast queries ----------------------------------------------------------------------------------------
def test_autocast_queries_inside_and_outside_hpu_autocast():
    assert ht.is_autocast_hpu_enabled() is False
    assert ht.get_autocast_hpu_dtype() == torch.bfloat16
    with torch.autocast("hpu", dtype=torch.bfloat16):
        assert ht.is_autocast_hpu_enabled() is True
        assert torch.hpu.get_autocast_hpu_dtype() == torch.bfloat16
        with torch.autocast("hpu", enabled=False):
            assert ht.is_autocast_hpu_enabled() is False
    with torch.autocast("hpu", dtype=torch.float16):
        assert ht.get_autocast_hpu_dtype() == torch.float16
    assert ht.is_autocast_hpu_enabled() is False and ht.get_autocast_hpu_dtype() == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert ht.is_autocast_hpu_enabled() is False


def test_autocast_setters_as_habana_binds_them():
    try:
        ht.set_autocast_hpu_enabled(1)  # Habana's binding enables only for the object True
        assert ht.is_autocast_hpu_enabled() is False
        ht.set_autocast_hpu_enabled(True)
        ht.set_autocast_hpu_dtype(torch.float16)
        assert ht.is_autocast_hpu_enabled() is True and ht.get_autocast_hpu_dtype() == torch.float16
        assert torch.is_autocast_enabled("hpu")
    finally:
        ht.set_autocast_hpu_enabled(False)
        ht.set_autocast_hpu_dtype(torch.bfloat16)


def test_the_kernel_modules_say_they_are_emulated():
    import habana_frameworks.torch.hpex.kernels as kernels
    import habana_frameworks.torch.hpex.kernels.FusedSDPA  # noqa: F401  (the module behind the class, as Habana's)
    import habana_frameworks.torch.hpex.normalization as normalization

    assert kernels.__emulated__ and normalization.__emulated__
    assert kernels.FusedSDPA is FusedSDPA  # the package attribute is the class, as in Habana's package
    assert kernels.__name__ == "habana_frameworks.torch.hpex.kernels"

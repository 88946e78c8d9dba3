"""Habana's fused optimizers and FusedEMA on the emulated Gaudi (habana_frameworks.torch.hpex.optimizers / movingavrg).

Each runs on `hpu` parameters and is compared, step by step, with torch.optim or a textbook update written here in
plain torch on the CPU; the argument checks are those of the bridge's Python sources (gaudi-pytorch-bridge 1.19).
"""

from __future__ import annotations

import copy
import math

import habana_frameworks.torch.core as htcore
import pytest
import torch
from habana_frameworks.torch.hpex.movingavrg import FusedEMA
from habana_frameworks.torch.hpex.optimizers import (
    AdamW,
    FusedAdagrad,
    FusedAdamW,
    FusedLamb,
    FusedLars,
    FusedResourceApplyMomentum,
    FusedSGD,
)
from torch import nn

STEPS = 3


def tanh_mlp(seed: int = 0) -> nn.Module:
    """No ReLU: every gradient entry is non-zero, so Adam-style denominators never meet 0/0."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def batches(n: int = STEPS, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(32, 8, generator=gen), torch.randn(32, 4, generator=gen)) for _ in range(n)]


def backward(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    device = next(model.parameters()).device
    loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
    loss.backward()


def train_pair(make_fused, make_ref, steps: int = STEPS, fused_device: str = "hpu"):
    """Yield (fused params on CPU, reference params) after every step of the same batches."""
    model = tanh_mlp()
    fused_model = copy.deepcopy(model).to(fused_device)
    ref_model = copy.deepcopy(model)
    fused_opt, ref_opt = make_fused(fused_model.parameters()), make_ref(ref_model.parameters())
    for x, y in batches(steps):
        for m, opt in ((fused_model, fused_opt), (ref_model, ref_opt)):
            opt.zero_grad()
            backward(m, x, y)
            opt.step()
        yield [p.detach().cpu() for p in fused_model.parameters()], [p.detach() for p in ref_model.parameters()]


def assert_params_close(fused: list[torch.Tensor], ref: list[torch.Tensor], rtol: float, atol: float) -> None:
    for a, b in zip(fused, ref):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------------------------------- FusedAdamW


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_fused_adamw_three_steps_equal_torch_adamw(weight_decay: float) -> None:
    args = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=weight_decay)
    for fused, ref in train_pair(lambda p: FusedAdamW(p, **args), lambda p: torch.optim.AdamW(p, **args)):
        # Equal but for where eps goes (Habana adds it before the bias correction, see the next test): an entry whose
        # gradient is ~1e-4 moves by up to ~1e-3 lr less or more; every other entry agrees to float rounding.
        assert_params_close(fused, ref, rtol=1e-5, atol=2e-3 * args["lr"])
    start = [p.detach() for p in tanh_mlp().parameters()]
    moved = max((a - b).abs().max().item() for a, b in zip(ref, start))
    assert moved > 1e-2  # three steps of lr 1e-2 really moved the weights


def habana_adamw_reference(params: list[torch.Tensor], grads_per_step: list[list[torch.Tensor]], lr: float,
                           betas: tuple[float, float], eps: float, weight_decay: float) -> list[torch.Tensor]:
    """The bridge's kernel, by hand: eps joins sqrt(v) before the bias correction (in the step size)."""
    b1, b2 = betas
    w = [p.clone() for p in params]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for t, grads in enumerate(grads_per_step, start=1):
        step_size = lr * math.sqrt(1 - b2**t) / (1 - b1**t)
        for i, g in enumerate(grads):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            w[i] = w[i] * (1 - lr * weight_decay) - step_size * m[i] / (v[i].sqrt() + eps)
    return w


def test_fused_adamw_adds_eps_before_bias_correction_as_habanas_kernel() -> None:
    """With a large eps the kernel's form shows: it matches the hand reference, and differs from torch's AdamW."""
    lr, betas, eps, wd = 1e-2, (0.9, 0.999), 1e-2, 0.05
    w0 = torch.randn(64, generator=torch.Generator().manual_seed(3))
    grads = [[torch.randn(64, generator=torch.Generator().manual_seed(10 + t)) * 0.1] for t in range(STEPS)]
    p = nn.Parameter(w0.clone().to("hpu"))
    q = nn.Parameter(w0.clone())
    fused, torch_adamw = FusedAdamW([p], lr=lr, betas=betas, eps=eps, weight_decay=wd), torch.optim.AdamW(
        [q], lr=lr, betas=betas, eps=eps, weight_decay=wd)
    for (g,) in grads:
        p.grad, q.grad = g.clone().to("hpu"), g.clone()
        fused.step()
        torch_adamw.step()
    expected = habana_adamw_reference([w0], grads, lr, betas, eps, wd)[0]
    torch.testing.assert_close(p.detach().cpu(), expected, rtol=1e-6, atol=1e-7)
    assert (q.detach() - expected).abs().max().item() > 1e-4  # torch's AdamW takes another step here


def test_fused_adamw_arguments_as_habanas() -> None:
    params = [nn.Parameter(torch.zeros(2).to("hpu"))]
    with pytest.raises(ValueError, match="Invalid learning rate"):
        FusedAdamW(params, lr=-1.0)
    with pytest.raises(ValueError, match="Invalid beta parameter"):
        FusedAdamW(params, betas=(1.0, 0.999))
    with pytest.raises(ValueError, match="Invalid beta parameter"):
        FusedAdamW(params, betas=(0.9, -0.1))
    with pytest.raises(ValueError, match="Invalid epsilon"):
        FusedAdamW(params, eps=-1e-8)
    with pytest.raises(TypeError, match="amsgrad"):  # Habana's FusedAdamW has no amsgrad argument at all
        FusedAdamW(params, amsgrad=True)
    opt = FusedAdamW(params)
    assert opt.defaults["eps"] == 1e-6 and opt.defaults["bias_correction"] is True  # Habana's defaults


def test_fused_adamw_without_bias_correction_and_group_step() -> None:
    lr, betas, eps = 1e-2, (0.9, 0.999), 1e-6
    w0 = torch.randn(32, generator=torch.Generator().manual_seed(4))
    p = nn.Parameter(w0.clone().to("hpu"))
    opt = FusedAdamW([p], lr=lr, betas=betas, eps=eps, bias_correction=False)
    m = torch.zeros(32)
    v = torch.zeros(32)
    w = w0.clone()
    for t in range(STEPS):
        g = torch.randn(32, generator=torch.Generator().manual_seed(20 + t))
        p.grad = g.to("hpu")
        opt.step()
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
        w = w - lr * m / (v.sqrt() + eps)
    torch.testing.assert_close(p.detach().cpu(), w, rtol=1e-6, atol=1e-7)
    assert opt.param_groups[0]["step"] == STEPS  # the bridge counts steps per group
    assert opt.state[p]["exp_avg"].device.type == "hpu"


def test_fused_adamw_bf16_moments_for_fp32_params() -> None:
    """moments_dtype=bfloat16: the state is kept in bf16, the update computes in fp32 (promoted), as the kernel does."""
    lr, betas, eps = 1e-2, (0.9, 0.999), 1e-6
    w0 = torch.randn(48, generator=torch.Generator().manual_seed(5))
    p = nn.Parameter(w0.clone().to("hpu"))
    opt = FusedAdamW([p], lr=lr, betas=betas, eps=eps, moments_dtype=torch.bfloat16)
    m = torch.zeros(48, dtype=torch.bfloat16)
    v = torch.zeros(48, dtype=torch.bfloat16)
    w = w0.clone()
    for t in range(1, STEPS + 1):
        g = torch.randn(48, generator=torch.Generator().manual_seed(30 + t))
        p.grad = g.to("hpu")
        opt.step()
        m32, v32 = 0.9 * m.float() + 0.1 * g, 0.999 * v.float() + 0.001 * g * g
        w = w - lr * math.sqrt(1 - 0.999**t) / (1 - 0.9**t) * m32 / (v32.sqrt() + eps)
        m, v = m32.bfloat16(), v32.bfloat16()
    state = opt.state[p]
    assert state["exp_avg"].dtype == torch.bfloat16 and state["exp_avg_sq"].dtype == torch.bfloat16
    assert p.dtype == torch.float32
    torch.testing.assert_close(state["exp_avg"].cpu(), m)
    torch.testing.assert_close(p.detach().cpu(), w, rtol=1e-5, atol=1e-6)


def test_fused_adamw_fp8_moments_keep_power_of_two_scales_and_train() -> None:
    args = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-6)
    fused_model = tanh_mlp().to("hpu")
    opt = FusedAdamW(fused_model.parameters(), moments_dtype=(torch.float8_e4m3fn, torch.float8_e5m2), **args)
    losses = []
    x, y = batches(1, seed=7)[0]
    for _ in range(10):
        opt.zero_grad()
        loss = nn.functional.mse_loss(fused_model(x.to("hpu")), y.to("hpu"))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    state = opt.state[fused_model[0].weight]
    assert state["exp_avg"].dtype == torch.float8_e4m3fn and state["exp_avg_sq"].dtype == torch.float8_e5m2
    for key in ("exp_avg_scale", "exp_avg_sq_scale"):
        scale = state[key].cpu().float()
        assert scale.shape == (1,) and scale.item() > 1.0
        assert math.log2(scale.item()) == int(math.log2(scale.item()))  # a power of two, as the bridge rounds it
    # The scaled e4m3 first moment uses Gaudi's range (240): its largest entry lands within [120, 240].
    top = state["exp_avg"].cpu().float().abs().max().item()
    assert 120.0 <= top <= 240.0
    assert losses[-1] < 0.8 * losses[0]


@pytest.mark.parametrize("moments_dtype", [torch.bfloat16, torch.float8_e4m3fn,
                                           (torch.float8_e4m3fn, torch.float8_e5m2), (torch.bfloat16, torch.float32)],
                         ids=["bf16", "e4m3", "e4m3-e5m2", "bf16-fp32"])
def test_fused_adamw_resumed_from_its_state_dict_continues_as_the_uninterrupted_run(moments_dtype) -> None:
    """torch's load_state_dict casts floating state to the parameter's dtype: fp8 moments came back as float32 still
    multiplied by their scale, bf16 ones as float32, and the run went elsewhere. Now they come back in their dtype
    (the scales as they were) and the resumed run is bit-for-bit the uninterrupted one."""
    import io

    args = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, moments_dtype=moments_dtype)
    data = batches(6, seed=3)

    def run(model: nn.Module, opt: torch.optim.Optimizer, steps) -> None:
        for x, y in steps:
            opt.zero_grad()
            backward(model, x, y)
            opt.step()

    straight = tanh_mlp().to("hpu")
    straight_opt = FusedAdamW(straight.parameters(), **args)
    run(straight, straight_opt, data)

    first = tanh_mlp().to("hpu")
    first_opt = FusedAdamW(first.parameters(), **args)
    run(first, first_opt, data[:3])
    buffer = io.BytesIO()
    torch.save({"model": first.state_dict(), "optimizer": first_opt.state_dict()}, buffer)
    buffer.seek(0)
    checkpoint = torch.load(buffer, weights_only=True)
    resumed = tanh_mlp(seed=99).to("hpu")
    resumed.load_state_dict(checkpoint["model"])
    resumed_opt = FusedAdamW(resumed.parameters(), **args)
    resumed_opt.load_state_dict(checkpoint["optimizer"])
    for p, q in zip(first.parameters(), resumed.parameters()):
        before, after = first_opt.state[p], resumed_opt.state[q]
        assert {k: v.dtype for k, v in after.items() if torch.is_tensor(v)} == \
            {k: v.dtype for k, v in before.items() if torch.is_tensor(v)}
        for key, value in before.items():
            if torch.is_tensor(value):
                assert torch.equal(after[key].cpu().float(), value.cpu().float()), key
    run(resumed, resumed_opt, data[3:])
    for a, b in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(a.detach().cpu(), b.detach().cpu())


def test_fused_adamw_refuses_what_habanas_checks_refuse() -> None:
    """A negative weight_decay (Habana's distributed FusedAdamW and MarkstepAdamW refuse it) and a moments_dtype that
    is not a floating dtype Gaudi keeps moments in (an int8 truncated the moments to zero; a string failed at step)."""
    from habana_frameworks.torch.hpex.optimizers.distributed.FusedAdamW import FusedAdamW as FunctionalFusedAdamW

    params = [nn.Parameter(torch.zeros(2).to("hpu"))]
    with pytest.raises(ValueError, match="Invalid weight_decay value: -0.1"):
        FusedAdamW(params, weight_decay=-0.1)
    for bad in (torch.int8, "bfloat16", torch.bool, (torch.bfloat16,), (torch.bfloat16, torch.int8), torch.float64,
                (torch.float8_e4m3fn, torch.bfloat16)):  # the last: a KeyError at step() before
        with pytest.raises(ValueError, match="moments_dtype"):
            FusedAdamW(params, moments_dtype=bad)
        with pytest.raises(ValueError, match="moments_dtype"):
            FunctionalFusedAdamW(list(params), moments_dtype=bad)
    for good in (None, torch.float32, torch.bfloat16, torch.float16, torch.float8_e5m2,
                 (torch.float8_e4m3fn, torch.float8_e5m2), (torch.bfloat16, torch.float32)):
        FusedAdamW(params, moments_dtype=good)


def test_markstep_adamw_is_torch_adamw_and_accepts_amsgrad(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    args = dict(lr=1e-2, weight_decay=0.01, amsgrad=True)
    before = htcore.placed_mark_steps
    for fused, ref in train_pair(lambda p: AdamW(p, **args), lambda p: torch.optim.AdamW(p, **args)):
        assert_params_close(fused, ref, rtol=1e-6, atol=1e-7)
    assert htcore.placed_mark_steps - before == 2 * STEPS


def test_fused_adamw_marks_steps_in_lazy_mode_only(monkeypatch: pytest.MonkeyPatch) -> None:
    p = nn.Parameter(torch.ones(3).to("hpu"))
    p.grad = torch.ones(3).to("hpu")
    before = htcore.placed_mark_steps
    FusedAdamW([p]).step()
    assert htcore.placed_mark_steps == before  # eager: nothing to mark
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    FusedAdamW([p]).step()
    assert htcore.placed_mark_steps == before + 2  # one before the group, one after the step


def test_functional_distributed_fused_adamw_takes_gradients_and_habanas_step() -> None:
    from habana_frameworks.torch.hpex.optimizers.distributed.FusedAdamW import FusedAdamW as FunctionalFusedAdamW

    lr, betas, eps, wd = 1e-2, (0.9, 0.999), 1e-3, 0.1
    w0 = torch.randn(24, generator=torch.Generator().manual_seed(6))
    grads = [[torch.randn(24, generator=torch.Generator().manual_seed(50 + t))] for t in range(STEPS)]
    p = w0.clone().to("hpu")
    opt = FunctionalFusedAdamW([p], lr=lr, betas=betas, eps=eps, weight_decay=wd)
    for (g,) in grads:
        opt.step([g.to("hpu")])
    torch.testing.assert_close(p.cpu(), habana_adamw_reference([w0], grads, lr, betas, eps, wd)[0], rtol=1e-6,
                               atol=1e-7)
    assert opt.state[p]["step"].item() == STEPS
    with pytest.raises(ValueError, match="size of the parameters"):
        opt.step([])
    with pytest.raises(RuntimeError, match="step_param"):
        opt.step_param(p, p)
    with pytest.raises(ValueError, match="empty parameter list"):
        FunctionalFusedAdamW([])


# ------------------------------------------------------------------------------------------------------ FusedSGD


@pytest.mark.parametrize("momentum,nesterov,weight_decay", [(0.0, False, 0.0), (0.9, False, 1e-3), (0.9, True, 1e-2)])
def test_fused_sgd_equals_torch_sgd(momentum: float, nesterov: bool, weight_decay: float) -> None:
    args = dict(lr=0.05, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)
    for fused, ref in train_pair(lambda p: FusedSGD(p, **args), lambda p: torch.optim.SGD(p, **args)):
        assert_params_close(fused, ref, rtol=1e-6, atol=1e-7)


def test_fused_sgd_dampening_starts_from_a_zero_buffer_and_follows_the_scheduler() -> None:
    lr, mom, damp = 0.1, 0.9, 0.5
    w0 = torch.randn(16, generator=torch.Generator().manual_seed(8))
    p = nn.Parameter(w0.clone().to("hpu"))
    opt = FusedSGD([p], lr=lr, momentum=mom, dampening=damp)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    buf, w = torch.zeros(16), w0.clone()
    for t in range(STEPS):
        g = torch.randn(16, generator=torch.Generator().manual_seed(40 + t))
        p.grad = g.to("hpu")
        opt.step()
        sched.step()
        buf = mom * buf + (1 - damp) * g
        w = w - lr * 0.5**t * buf
    torch.testing.assert_close(p.detach().cpu(), w, rtol=1e-6, atol=1e-7)


def test_fused_sgd_arguments_as_habanas() -> None:
    params = [nn.Parameter(torch.zeros(2).to("hpu"))]
    with pytest.raises(TypeError, match="lr"):
        FusedSGD(params)
    for bad in (dict(lr=-0.1), dict(lr=0.1, momentum=-1), dict(lr=0.1, weight_decay=-1), dict(lr=0.1, dampening=-1)):
        with pytest.raises(ValueError, match="Invalid"):
            FusedSGD(params, **bad)
    with pytest.raises(ValueError, match="Nesterov momentum requires a momentum and zero dampening"):
        FusedSGD(params, lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="Nesterov"):
        FusedSGD(params, lr=0.1, momentum=0.9, dampening=0.1, nesterov=True)


# ----------------------------------------------------------------------------------------------------- FusedLamb


def textbook_lamb(params: list[torch.Tensor], grads_per_step: list[list[torch.Tensor]], lr: float,
                  betas: tuple[float, float], eps: float, weight_decay: float, max_grad_norm: float | None,
                  use_lamb: bool = False) -> list[torch.Tensor]:
    """LAMB with global gradient clipping (NVIDIA's form): Adam direction + decoupled decay, layer-wise trust ratio."""
    b1, b2 = betas
    w = [p.clone() for p in params]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for t, grads in enumerate(grads_per_step, start=1):
        total = math.sqrt(sum(float((g * g).sum()) for g in grads))
        clip = total / max_grad_norm if max_grad_norm is not None and total > max_grad_norm else 1.0
        for i, g in enumerate(grads):
            g = g / clip
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            update = (m[i] / (1 - b1**t)) / ((v[i] / (1 - b2**t)).sqrt() + eps) + weight_decay * w[i]
            trust = 1.0
            if weight_decay != 0 or use_lamb:
                u_norm, w_norm = update.norm().item(), w[i].norm().item()
                # Habana's reference (the bridge's tests, TorchNVLAMB): 1 unless both norms are positive
                trust = w_norm / u_norm if u_norm > 0 and w_norm > 0 else 1.0
            w[i] = w[i] - lr * trust * update
    return w


def grads_of(model: nn.Module, steps: int) -> list[list[torch.Tensor]]:
    """Gradients of a fixed model on fixed batches (LAMB/LARS references then take the same gradients)."""
    out = []
    for x, y in batches(steps):
        model.zero_grad()
        backward(model, x, y)
        out.append([p.grad.detach().clone() for p in model.parameters()])
    return out


@pytest.mark.parametrize("weight_decay,max_grad_norm,use_lamb", [(0.01, 0.05, False), (0.0, None, False),
                                                                 (0.0, 1.0, True)])
def test_fused_lamb_equals_textbook_lamb(weight_decay: float, max_grad_norm: float | None, use_lamb: bool) -> None:
    lr, betas, eps = 1e-2, (0.9, 0.999), 1e-6
    model = tanh_mlp()
    grads = grads_of(model, STEPS)
    start = [p.detach().clone() for p in model.parameters()]
    fused_params = [nn.Parameter(p.clone().to("hpu")) for p in start]
    opt = FusedLamb(fused_params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, max_grad_norm=max_grad_norm,
                    use_lamb=use_lamb)
    for step_grads in grads:
        opt.zero_grad()
        for p, g in zip(fused_params, step_grads):
            p.grad = g.to("hpu")
        opt.step()
    expected = textbook_lamb(start, grads, lr, betas, eps, weight_decay, max_grad_norm, use_lamb)
    assert_params_close([p.detach().cpu() for p in fused_params], expected, rtol=1e-5, atol=1e-6)
    opt.zero_grad()
    assert all(p.grad is None for p in fused_params)  # set_grad_none=True, Habana's default


@pytest.mark.parametrize("use_lamb,weight_decay", [(False, 0.01), (True, 0.0)])
def test_fused_lamb_moves_a_zero_initialised_parameter_with_trust_ratio_one(use_lamb: bool,
                                                                           weight_decay: float) -> None:
    """|w| = 0 made the trust ratio |w| / |u| = 0: a zero-initialised parameter (a bias) never moved. Habana's reference
    LAMB uses 1 there. Compared with that reference computed in float64."""
    lr, betas, eps = 1e-2, (0.9, 0.999), 1e-6
    gen = torch.Generator().manual_seed(11)
    start = [torch.zeros(4, 3), torch.randn(5, generator=gen), torch.zeros(7)]
    grads = [[torch.randn(p.shape, generator=gen) for p in start] for _ in range(STEPS)]
    params = [nn.Parameter(p.clone().to("hpu")) for p in start]
    opt = FusedLamb(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, max_grad_norm=None,
                    use_lamb=use_lamb)
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.to("hpu")
        opt.step()
    expected = textbook_lamb([p.double() for p in start], [[g.double() for g in gs] for gs in grads], lr, betas, eps,
                             weight_decay, None, use_lamb)
    got = [p.detach().cpu() for p in params]
    assert got[0].abs().min() > 0 and got[2].abs().min() > 0  # the zero-initialised ones moved
    assert_params_close([g.double() for g in got], expected, rtol=1e-5, atol=1e-7)


def test_fused_lamb_refuses_amsgrad() -> None:
    with pytest.raises(RuntimeError, match="AMSGrad"):
        FusedLamb([nn.Parameter(torch.zeros(2).to("hpu"))], amsgrad=True)


# ---------------------------------------------------------------------------- FusedLars + FusedResourceApplyMomentum


def textbook_lars_momentum(params: list[torch.Tensor], grads_per_step: list[list[torch.Tensor]], skip: list[int],
                           lr: float, momentum: float, weight_decay: float, eeta: float,
                           eps: float) -> list[torch.Tensor]:
    """LARS as MLPerf's ResNet (TensorFlow): scaled step s = lr*trust*(g + wd w) (lr*g where skipped), then
    ResourceApplyMomentum: buf = momentum buf - s, w += buf; the bridge's first step seeds buf = s and adds it."""
    w = [p.clone() for p in params]
    buf: list[torch.Tensor | None] = [None] * len(params)
    for grads in grads_per_step:
        for i, g in enumerate(grads):
            if skip[i]:
                p_norm, g_norm = w[i].norm(), g.norm()
                trust = eeta * p_norm / (p_norm * weight_decay + eps + g_norm) if p_norm > 0 and g_norm > 0 else 1.0
                s = lr * trust * (g + weight_decay * w[i])
            else:
                s = lr * g
            if buf[i] is None:
                buf[i] = s.clone()
                w[i] = w[i] + s
            else:
                buf[i] = momentum * buf[i] - s
                w[i] = w[i] + buf[i]
    return w


def test_fused_lars_with_resource_apply_momentum_equals_textbook() -> None:
    lr, momentum, wd, eeta, eps = 0.1, 0.9, 1e-3, 0.02, 1e-8
    model = tanh_mlp()
    grads = grads_of(model, STEPS)
    start = [p.detach().clone() for p in model.parameters()]
    skip = [1, 0, 1, 0]  # LARS on the weights, plain momentum on the biases
    fused_params = [nn.Parameter(p.clone().to("hpu")) for p in start]
    inner = FusedResourceApplyMomentum(fused_params, lr=lr, momentum=momentum, weight_decay=wd)
    opt = FusedLars(inner, skip, eeta=eeta, eps=eps)
    for step_grads in grads:
        for p, g in zip(fused_params, step_grads):
            p.grad = g.clone().to("hpu")
        opt.step()
        assert inner.param_groups[0]["weight_decay"] == wd  # handed back after every step
    expected = textbook_lars_momentum(start, grads, skip, lr, momentum, wd, eeta, eps)
    assert_params_close([p.detach().cpu() for p in fused_params], expected, rtol=1e-5, atol=1e-7)


def test_fused_resource_apply_momentum_arguments_as_habanas() -> None:
    params = [nn.Parameter(torch.zeros(2).to("hpu"))]
    with pytest.raises(ValueError, match="Invalid learning rate"):
        FusedResourceApplyMomentum(params, lr=-1)
    with pytest.raises(ValueError, match="Invalid momentum"):
        FusedResourceApplyMomentum(params, lr=0.1, momentum=-0.1)
    with pytest.raises(ValueError, match="Invalid weight_decay"):
        FusedResourceApplyMomentum(params, lr=0.1, weight_decay=-0.1)
    with pytest.raises(ValueError, match="Nesterov momentum requires a momentum"):
        FusedResourceApplyMomentum(params, lr=0.1, nesterov=True)


# -------------------------------------------------------------------------------------------------- FusedAdagrad


def test_fused_adagrad_equals_torch_adagrad() -> None:
    args = dict(lr=0.05, lr_decay=0.01, weight_decay=1e-3, initial_accumulator_value=0.1, eps=1e-10)
    for fused, ref in train_pair(lambda p: FusedAdagrad(p, **args), lambda p: torch.optim.Adagrad(p, **args)):
        assert_params_close(fused, ref, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="Invalid lr_decay"):
        FusedAdagrad([nn.Parameter(torch.zeros(2).to("hpu"))], lr_decay=-1)


# ------------------------------------------------------------------------------------------------------ FusedEMA


def test_fused_ema_equals_hand_ema_of_parameters_and_buffers() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6)).to("hpu")
    decay = 0.999
    ema = FusedEMA(model, decay=decay)
    assert not ema.ema.training and ema.ema is not model
    expected = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for t in range(1, STEPS + 1):
        x = torch.randn(16, 6).to("hpu")
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        ema.update(model)
        d = decay * (1 - math.exp(-t / 2000))  # Habana's ramp
        for k, v in model.state_dict().items():
            if v.is_floating_point():
                expected[k] = expected[k] * d + (1 - d) * v.detach().cpu()
    got = ema.ema.state_dict()
    for k, v in expected.items():
        if v.is_floating_point():
            torch.testing.assert_close(got[k].cpu(), v, rtol=1e-6, atol=1e-7)
    assert ema.updates == STEPS
    assert got["1.running_mean"].abs().sum().item() > 0  # buffers are averaged too


def test_fused_ema_refuses_negative_decay_and_copies_attributes() -> None:
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="Invalid decay"):
        FusedEMA(model, decay=-0.1)
    ema = FusedEMA(model)
    model.names, model._private = ["a"], 1
    ema.update_attr(model)
    assert ema.ema.names == ["a"] and not hasattr(ema.ema, "_private")

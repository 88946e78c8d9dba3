"""16-mixed's loss scaler on HPU: the emulated device refuses the two ATen ops Habana's bridge has no HPU kernel for
(as a Gaudi does), and HPUGradScaler / HPUShardedGradScaler, which use plain tensor ops instead, give torch's
GradScaler's numbers on the CPU step for step: the scale, the skipped steps, the unscaled gradients, the weights."""

from __future__ import annotations

import multiprocessing

import pytest
import torch
import torch.distributed as dist

from hpu_nb.core.mixed_precision import (
    HPUGradScaler,
    HPUShardedGradScaler,
    non_finite_check_and_unscale_,
    update_scale_,
)
from hpu_nb.emulator import hpu_device
from hpu_nb.emulator.backend import EmulatedBackend
from hpu_nb.emulator.hpu_device.missing_kernels import OPS_WITHOUT_HPU_KERNEL


@pytest.fixture
def card():
    EmulatedBackend()
    hpu_device.load()
    return torch.device("hpu")


def _amp_ops_args(device: str) -> dict[str, tuple[tuple, dict]]:
    """Arguments (positional, keyword) for every overload of the two amp ops, on `device`."""
    grads = [torch.tensor([1.0, 2.0], device=device)]
    found_inf, inv_scale = torch.zeros(1, device=device), torch.full((1,), 0.5, device=device)
    scale, tracker = torch.ones((), device=device), torch.zeros((), dtype=torch.int32, device=device)
    return {
        "_amp_foreach_non_finite_check_and_unscale_": ((grads, found_inf, inv_scale), {}),
        "_amp_foreach_non_finite_check_and_unscale": ((grads, found_inf, inv_scale), {}),
        "_amp_foreach_non_finite_check_and_unscale.out": (
            (grads, found_inf, inv_scale), {"out": [torch.empty(2, device=device)]}),
        "_amp_update_scale_": ((scale, tracker, found_inf, 2.0, 0.5, 10), {}),
        "_amp_update_scale": ((scale, tracker, found_inf, 2.0, 0.5, 10), {}),
        "_amp_update_scale.out": (
            (scale, tracker, found_inf, 2.0, 0.5, 10), {"out": torch.empty((), device=device)}),
    }


def _aten(name: str):
    op, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, op), overload or "default")


# -- the refusal ----------------------------------------------------------------------------------------------------
def test_every_overload_of_the_amp_ops_is_in_the_list():
    overloads = {name.removeprefix("aten::") for name in torch._C._dispatch_get_all_op_names()
                 if name.startswith(("aten::_amp_foreach_non_finite_check_and_unscale", "aten::_amp_update_scale"))}
    assert overloads == set(OPS_WITHOUT_HPU_KERNEL) and len(overloads) == 6


@pytest.mark.parametrize("name", OPS_WITHOUT_HPU_KERNEL)
def test_amp_op_is_refused_on_hpu_as_on_a_gaudi_and_runs_on_cpu(card, name):
    with pytest.raises(NotImplementedError, match=rf"'aten::{name.split('.')[0]}' .* the 'HPU' backend"):
        args, kwargs = _amp_ops_args("hpu")[name]
        _aten(name)(*args, **kwargs)
    args, kwargs = _amp_ops_args("cpu")[name]
    _aten(name)(*args, **kwargs)  # the CPU kernel still runs
    if name == "_amp_foreach_non_finite_check_and_unscale_":
        assert args[0][0].tolist() == [0.5, 1.0] and args[1].item() == 0.0
    if name == "_amp_update_scale_":
        assert args[0].item() == 1.0 and args[1].item() == 1  # one good step counted, no growth yet


def test_torchs_grad_scaler_fails_on_hpu_at_its_first_unscale(card):
    param = torch.nn.Parameter(torch.ones(3, device="hpu"))
    scaler = torch.amp.GradScaler("hpu")
    scaler.scale(param.sum()).backward()
    with pytest.raises(NotImplementedError, match="_amp_foreach_non_finite_check_and_unscale_.*HPUGradScaler"):
        scaler.step(torch.optim.SGD([param], lr=0.1))


# -- the two kernels in plain ops, against torch's CPU kernels, bit for bit ------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("inv_scale", [2.0**-16, 1 / 3000.0, 1.0])
@pytest.mark.parametrize("bad", [None, float("inf"), float("-inf"), float("nan")])
def test_non_finite_check_and_unscale_is_torchs_kernel(card, dtype, inv_scale, bad):
    g = torch.Generator().manual_seed(3)
    grads = [torch.randn(37, generator=g).mul(1000).to(dtype), torch.randn(4, 5, generator=g).mul(10000).to(dtype),
             torch.randn(3, generator=g).mul(1e-3).to(dtype)]
    if bad is not None:
        grads[1][2, 3] = bad
    for start in (0.0, 1.0):  # found_inf stays 1.0 once set, whatever the gradients
        theirs, mine = [t.clone() for t in grads], [t.to("hpu") for t in grads]
        found_theirs, found_mine = torch.full((1,), start), torch.full((1,), start, device="hpu")
        inv = torch.full((1,), inv_scale)
        torch._amp_foreach_non_finite_check_and_unscale_(theirs, found_theirs, inv)
        non_finite_check_and_unscale_(mine, found_mine, inv.to("hpu"))
        assert found_mine.item() == found_theirs.item() == (1.0 if bad is not None or start else 0.0)
        for a, b in zip(theirs, mine):
            assert b.dtype == dtype and torch.equal(a.view(-1).isnan(), b.cpu().view(-1).isnan())
            assert torch.equal(a.nan_to_num(), b.cpu().nan_to_num())  # bitwise, nan where torch's is nan


@pytest.mark.parametrize(("growth", "backoff", "interval"), [(2.0, 0.5, 3), (3.0, 0.3, 2), (1.5, 0.9, 1)])
def test_update_scale_is_torchs_kernel(card, growth, backoff, interval):
    g = torch.Generator().manual_seed(5)
    found_sequence = (torch.rand(40, generator=g) < 0.3).float() * torch.randint(1, 3, (40,), generator=g)
    theirs_scale, theirs_tracker = torch.tensor(3000.0), torch.tensor(0, dtype=torch.int32)
    mine_scale, mine_tracker = theirs_scale.to("hpu"), theirs_tracker.to("hpu")
    for found in found_sequence:
        torch._amp_update_scale_(theirs_scale, theirs_tracker, found.reshape(1), growth, backoff, interval)
        update_scale_(mine_scale, mine_tracker, found.reshape(1).to("hpu"), growth, backoff, interval)
        assert mine_scale.item() == theirs_scale.item() and mine_tracker.item() == theirs_tracker.item()
    assert len(set(found_sequence.tolist())) == 3  # steps with no inf, and inf counted once and twice


def test_update_scale_does_not_grow_past_float32(card):
    theirs_scale, theirs_tracker = torch.tensor(3e38), torch.tensor(1, dtype=torch.int32)
    mine_scale, mine_tracker = theirs_scale.to("hpu"), theirs_tracker.to("hpu")
    torch._amp_update_scale_(theirs_scale, theirs_tracker, torch.zeros(1), 2.0, 0.5, 2)
    update_scale_(mine_scale, mine_tracker, torch.zeros(1, device="hpu"), 2.0, 0.5, 2)
    assert mine_scale.item() == theirs_scale.item() == pytest.approx(3e38) and mine_tracker.item() == 0


# -- the scaler: torch's on the CPU, step for step ---------------------------------------------------------------------
def _train(scaler: torch.amp.GradScaler, device: str, steps: int = 12, bad_at: dict[int, float] | None = None) -> list:
    """A small MLP trained with SGD under `scaler`; step i's loss is multiplied by bad_at[i] (inf / nan) when given.
    Returns, per step: scale, growth tracker, the unscaled gradients, whether the step was taken, the weights."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(device)
    optimizer = torch.optim.SGD([{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 0.05}],
                                lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    record = []
    for step in range(steps):
        x, y = torch.randn(32, 8, generator=g).to(device), torch.randn(32, 4, generator=g).to(device)
        loss = torch.nn.functional.mse_loss(model(x), y) * 1e-3
        if bad_at and step in bad_at:
            loss = loss * bad_at[step]
        before = [p.detach().cpu().clone() for p in model.parameters()]
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        grads = [p.grad.detach().cpu().clone() for p in model.parameters()]
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        after = [p.detach().cpu().clone() for p in model.parameters()]
        taken = any(not torch.equal(a, b) for a, b in zip(before, after))
        record.append((scaler.get_scale(), scaler._get_growth_tracker(), grads, taken, after))
    return record


@pytest.mark.parametrize("factors", [{}, {"growth_factor": 3.0, "backoff_factor": 0.3, "init_scale": 1000.0}])
def test_hpu_grad_scaler_matches_torchs_on_cpu_step_for_step(card, factors):
    bad_at = {2: float("inf"), 3: float("nan"), 7: float("inf")}
    theirs = _train(torch.amp.GradScaler("cpu", growth_interval=3, **factors), "cpu", bad_at=bad_at)
    scaler = HPUGradScaler(growth_interval=3, **factors)
    mine = _train(scaler, "hpu", bad_at=bad_at)
    assert scaler._scale is not None and scaler._scale.device.type == "hpu"
    for step, (a, b) in enumerate(zip(theirs, mine)):
        assert b[0] == a[0] and b[1] == a[1], step  # scale and growth tracker
        assert b[3] == a[3] == (step not in bad_at), step  # the step is skipped exactly when the gradients are bad
        for ga, gb in zip(a[2], b[2]):
            assert torch.equal(ga.nan_to_num(), gb.nan_to_num()) and torch.equal(ga.isnan(), gb.isnan()), step
        for wa, wb in zip(a[4], b[4]):
            torch.testing.assert_close(wb, wa, rtol=1e-6, atol=1e-7)
    scales = [r[0] for r in theirs]
    init = factors.get("init_scale", 2.0**16)
    backoff, growth = factors.get("backoff_factor", 0.5), factors.get("growth_factor", 2.0)
    # backed off at each bad step, grown after every 3 good steps in a row (steps 6, 10, 11 end such runs)
    assert scales[2] == pytest.approx(init * backoff) and scales[3] == pytest.approx(init * backoff**2)
    assert scales[6] == pytest.approx(init * backoff**2 * growth) and scales[11] == pytest.approx(
        init * backoff**3 * growth**2)
    assert scaler.state_dict() == torch.amp.GradScaler("cpu", growth_interval=3, **factors).state_dict() | {
        "scale": scales[-1], "_growth_tracker": theirs[-1][1]}


def test_hpu_grad_scaler_is_a_torch_grad_scaler_with_torchs_checks(card):
    scaler = HPUGradScaler()
    assert isinstance(scaler, torch.amp.GradScaler) and scaler._device == "hpu" and scaler.get_scale() == 2.0**16
    param = torch.nn.Parameter(torch.ones(2, device="hpu", dtype=torch.float16))
    optimizer = torch.optim.SGD([param], lr=0.1)
    scaler.scale(param.float().sum()).backward()
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        scaler.unscale_(optimizer)  # as torch's: the sharded one allows float16 gradients
    param = torch.nn.Parameter(torch.ones(2, device="hpu"))
    optimizer = torch.optim.SGD([param], lr=0.1)
    scaler.scale(param.sum()).backward()
    scaler.unscale_(optimizer)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update(new_scale=8.0)  # a scale set by hand: torch's path
    assert scaler.get_scale() == 8.0 and param.detach().cpu().tolist() == pytest.approx([0.9, 0.9])
    assert not HPUGradScaler(enabled=False).is_enabled()


# -- the sharded scaler: found_inf all-reduced across ranks (two processes, HCCL on the emulated cards) ------------
def _sharded_rank(rank: int, init_file: str, results: multiprocessing.Queue) -> None:  # pragma: no cover - child
    try:
        hpu_device.fresh_card()
        dist.init_process_group("hccl", init_method=f"file://{init_file}", rank=rank, world_size=2)
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 4).to("hpu")
        offloaded = torch.nn.Parameter(torch.ones(3))  # a parameter on the host, as FSDP's CPU offload keeps them
        optimizer = torch.optim.SGD([*model.parameters(), offloaded], lr=0.1)
        scaler = HPUShardedGradScaler(growth_interval=2)
        record = []
        for step in range(4):
            x = torch.full((2, 4), float(rank + 1), device="hpu")
            loss = model(x).sum() * 1e-3
            if (step, rank) == (1, 1):
                loss = loss * float("inf")  # only rank 1 overflows: both ranks must skip
            scaler.scale(loss).backward()
            bad = (step, rank) == (2, 0)  # only rank 0's host gradient is nan at step 2
            offloaded.grad = torch.full((3,), float("nan") if bad else scaler.get_scale())  # scaled, unscales to 1
            before = model.weight.detach().cpu().clone()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            taken = not torch.equal(before, model.weight.detach().cpu())
            record.append((scaler.get_scale(), taken, offloaded.detach().tolist()))
        results.put((rank, record))
        dist.destroy_process_group()
    except BaseException as err:
        results.put((rank, repr(err)))
        raise


def test_sharded_scaler_skips_the_step_on_every_rank_when_one_overflows(card, tmp_path):
    torch.ones(1, device="hpu")  # the card in use before the fork, as in a notebook
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    procs = [context.Process(target=_sharded_rank, args=(rank, str(tmp_path / "pg"), results)) for rank in (0, 1)]
    for proc in procs:
        proc.start()
    got = dict(results.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0, got
    scale = 2.0**16
    for rank in (0, 1):
        assert isinstance(got[rank], list), got[rank]
        assert [r[1] for r in got[rank]] == [True, False, False, True]  # step 1: rank 1's inf, step 2: rank 0's nan
        assert [r[0] for r in got[rank]] == [scale, scale / 2, scale / 4, scale / 4]
    assert got[0][-1][2] == got[1][-1][2] == pytest.approx([1.0 - 0.1 * 2] * 3)  # the host parameter: steps 0, 3


def test_sharded_scaler_is_torchs_sharded_scaler_on_hpu(card):
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    scaler = HPUShardedGradScaler(init_scale=1024.0, process_group=None)
    assert isinstance(scaler, ShardedGradScaler) and isinstance(scaler, HPUGradScaler)
    assert scaler._device == "hpu" and scaler.get_scale() == 1024.0 and scaler.process_group is None
    assert HPUShardedGradScaler().process_group is dist.group.WORLD

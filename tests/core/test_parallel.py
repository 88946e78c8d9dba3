"""HPUParallelStrategy / HPUDDPStrategy: selection, HCCL semantics, the Gaudi path (fake), real 2-process runs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.strategies import StrategyRegistry
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning.pytorch.trainer.connectors import accelerator_connector

import hpu_nb  # noqa: F401
from hpu_nb.core.accelerator import HPUAccelerator
from hpu_nb.core.strategies.parallel import (
    HPUDDPStrategy,
    HPUMultiProcessingLauncher,
    HPUParallelStrategy,
    hccl_reduce,
    reduce_op_name,
)
from hpu_nb.runtime import distributed as hpu_dist
from hpu_nb.runtime import get_backend
from tests.fake_habana import install_fake_habana

ROOT = Path(__file__).resolve().parents[2]
FIT = ROOT / "tests" / "dist_scripts" / "fit.py"


def run_fit(out: Path, *args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    for key in ("HPU_NB_BACKEND", "PT_HPU_LAZY_MODE", "HABANA_VISIBLE_MODULES", "DS_ACCELERATOR", "DEEPSPEED_USE_HPU",
                "PT_HPU_LAZY_ACC_PAR_MODE", "HLS_MODULE_ID", "WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT"):
        if env is None or key not in env:
            full_env.pop(key, None)
    return subprocess.run(
        [sys.executable, str(FIT), "--out", str(out), *args],
        capture_output=True, text=True, timeout=timeout, env=full_env, cwd=str(out.parent), check=False,
    )


def rank_reports(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


# -- selection -------------------------------------------------------------------------------------------------------
def test_names_are_registered():
    assert StrategyRegistry["hpu_parallel"]["strategy"] is HPUParallelStrategy
    assert StrategyRegistry["hpu_ddp"]["strategy"] is HPUDDPStrategy


def test_two_hpus_choose_parallel_strategy_with_script_launcher(monkeypatch):
    monkeypatch.setattr(accelerator_connector, "_IS_INTERACTIVE", False)
    trainer = L.Trainer(accelerator="hpu", devices=2, logger=False)
    assert type(trainer.strategy) is HPUParallelStrategy
    assert isinstance(trainer.accelerator, HPUAccelerator)
    assert trainer.strategy.parallel_devices == [torch.device("hpu", 0)] * 2  # each process's own card
    assert trainer.num_devices == 2
    assert isinstance(trainer.strategy.launcher, _SubprocessScriptLauncher)


def test_in_a_notebook_the_strategy_forks(monkeypatch):
    monkeypatch.setattr(accelerator_connector, "_IS_INTERACTIVE", True)
    trainer = L.Trainer(accelerator="hpu", devices=2, logger=False)
    launcher = trainer.strategy.launcher
    assert isinstance(launcher, HPUMultiProcessingLauncher) and launcher.is_interactive_compatible
    assert launcher._start_method == "fork"


def test_hpu_parallel_devices_given_to_the_strategy_are_kept():
    strategy = HPUDDPStrategy(parallel_devices=[torch.device("hpu")] * 3)
    trainer = L.Trainer(accelerator="hpu", strategy=strategy, logger=False)
    assert isinstance(trainer.accelerator, HPUAccelerator)
    assert trainer.strategy.parallel_devices == [torch.device("hpu")] * 3 and trainer.num_devices == 3
    assert trainer.strategy.root_device == torch.device("hpu", 0)  # completed with this process's card index


def test_bad_start_method_is_refused():
    with pytest.raises(ValueError, match="start_method='thread'"):
        HPUParallelStrategy(start_method="thread")


# -- HCCL reduce semantics -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["band", torch.distributed.ReduceOp.BAND, "bxor"])
def test_reduce_ops_hccl_lacks_are_type_errors_as_in_lightning_habana(op):
    shown = op if isinstance(op, str) else str(op)
    # the start of lightning-habana's message, which its tests match: the ops listed are hpu_nb's (with product)
    with pytest.raises(TypeError, match=re.escape(
            f"Unsupported ReduceOp {shown}. Supported ops in HCCL are: sum, min, max, product; and 'mean'")):
        reduce_op_name(op)


@pytest.mark.parametrize("op", ["product", "PROD", torch.distributed.ReduceOp.PRODUCT])
def test_product_is_an_hccl_reduction(op):
    """HCCL has hcclProd (the bridge's hccl_kernels.cpp); hpu_nb refused it."""
    assert reduce_op_name(op) == "product"


def test_reduce_without_process_group_returns_the_tensor():
    t = torch.tensor([1.0, 2.0])
    assert hccl_reduce(t, reduce_op="sum") is t


def _reduce_worker(rank: int, port: int, out_dir: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        base = torch.tensor([rank + 1, 10 * (rank + 1)])  # rank0: [1, 10], rank1: [2, 20] (Long)
        results = {
            "sum": hccl_reduce(base.clone(), reduce_op="sum").tolist(),
            "min": hccl_reduce(base.clone(), reduce_op=torch.distributed.ReduceOp.MIN).tolist(),
            "max": hccl_reduce(base.clone(), reduce_op="MAX").tolist(),
            "product": hccl_reduce(base.clone(), reduce_op="product").tolist(),
        }
        mean = hccl_reduce(base.clone(), reduce_op="mean")
        results["mean"], results["mean_dtype"] = mean.tolist(), str(mean.dtype)
        results["avg"] = hccl_reduce(torch.tensor([float(rank)]), reduce_op=torch.distributed.ReduceOp.AVG).tolist()
        Path(out_dir, f"reduce{rank}.json").write_text(json.dumps(results))
    finally:
        torch.distributed.destroy_process_group()


def test_a_program_that_leaves_its_hccl_group_gets_it_destroyed_before_finalization():
    """gloo under the emulated HCCL aborts the process when its group dies in interpreter finalization (torch issue
    190489: "terminate called without an active exception"); the group is destroyed by an exit handler instead."""
    script = textwrap.dedent("""
        import atexit
        import torch
        import torch.distributed as dist
        import habana_frameworks.torch.distributed.hccl  # registers "hccl", as on a Gaudi

        atexit.register(lambda: print("initialized at exit:", dist.is_initialized()))  # runs after handlers added later
        dist.init_process_group("hccl", store=dist.HashStore(), rank=0, world_size=1)
        t = torch.ones(4, device="hpu")
        dist.all_reduce(t, op=dist.ReduceOp.AVG)  # work with a Python callback, as Lightning's mean reductions make
        print("reduced:", t.tolist())
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPU_NB_", "PT_HPU_"))}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**env, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "reduced: [1.0, 1.0, 1.0, 1.0]" in done.stdout
    assert "initialized at exit: False" in done.stdout


@pytest.mark.timeout(60)
def test_reduce_semantics_across_two_processes(tmp_path):
    from lightning.fabric.plugins.environments.lightning import find_free_network_port
    from torch.multiprocessing import start_processes

    start_processes(_reduce_worker, args=(find_free_network_port(), str(tmp_path)), nprocs=2, start_method="fork")
    for rank in range(2):
        got = json.loads((tmp_path / f"reduce{rank}.json").read_text())
        assert got["sum"] == [3, 30] and got["min"] == [1, 10] and got["max"] == [2, 20] and got["product"] == [2, 200]
        assert got["mean"] == [1.5, 15.0] and got["mean_dtype"] == "torch.float32"  # Long -> float, sum / 2
        assert got["avg"] == [0.5]


# -- the Gaudi path, against the fake habana_frameworks --------------------------------------------------------------
def test_hccl_is_imported_and_initialised_before_the_process_group(monkeypatch):
    from lightning.fabric.plugins.environments import LightningEnvironment
    from lightning.fabric.plugins.environments.lightning import find_free_network_port

    monkeypatch.setenv("MASTER_PORT", str(find_free_network_port()))
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "4,5")
    with install_fake_habana(device_count=8) as fake:
        seen_at_init: list[list[str]] = []
        original = torch.distributed.init_process_group

        def recording_init(backend, *args, **kwargs):
            seen_at_init.append([backend, *[c.name for c in fake.calls.all()]])
            return original(backend, *args, **kwargs)

        monkeypatch.setattr(torch.distributed, "init_process_group", recording_init)
        strategy = HPUParallelStrategy(parallel_devices=[torch.device("hpu")],
                                       cluster_environment=LightningEnvironment())
        try:
            strategy.setup_distributed()
            assert torch.distributed.get_backend() == "hccl"
        finally:
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()
        backend, *calls_before = seen_at_init[0]
        assert backend == "hccl"
        hccl_import = calls_before.index("import habana_frameworks.torch.distributed.hccl")
        init_hpu = [i for i, name in enumerate(calls_before) if name.endswith(".initialize_distributed_hpu")]
        assert init_hpu and init_hpu[0] > hccl_import  # import (registers "hccl"), initialise, then the group
        call = fake.calls.named("initialize_distributed_hpu")[-1]
        assert call.kwargs == {"world_size": 1, "rank": 0, "local_rank": 0}
        # one process: Habana binds no module id (it acquires by type); with several, each local rank gets its own
        assert "HLS_MODULE_ID" not in os.environ


@pytest.mark.parametrize("flavour", ["trainer", "fabric"])
def test_a_subclass_setup_hccl_env_runs_once_before_the_process_group_with_the_ranks_place(monkeypatch, flavour):
    """lightning-habana's `setup_hccl_env` hook: a subclass that overrides it (and calls super()) runs before
    `init_process_group`, once the world size is known, for the Trainer's strategy and for Fabric's."""
    from lightning.fabric.plugins.environments import LightningEnvironment
    from lightning.fabric.plugins.environments.lightning import find_free_network_port

    from hpu_nb import fabric as hpu_fabric

    base = HPUParallelStrategy if flavour == "trainer" else hpu_fabric.HPUParallelStrategy
    events: list[tuple[str, int]] = []

    class Custom(base):  # type: ignore[misc, valid-type]
        def setup_hccl_env(self) -> None:
            events.append(("setup_hccl_env", self.world_size))
            super().setup_hccl_env()

    original = torch.distributed.init_process_group

    def recording_init(*args, **kwargs):
        events.append(("init_process_group", kwargs.get("world_size", -1)))
        return original(*args, **kwargs)

    monkeypatch.setenv("MASTER_PORT", str(find_free_network_port()))
    monkeypatch.setattr(torch.distributed, "init_process_group", recording_init)
    strategy = Custom(parallel_devices=[torch.device("hpu")], cluster_environment=LightningEnvironment())
    strategy.accelerator = HPUAccelerator() if flavour == "trainer" else hpu_fabric.HPUAccelerator()
    try:
        strategy.setup_environment()
        assert torch.distributed.get_backend() == "hccl"
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    assert events == [("setup_hccl_env", 1), ("init_process_group", 1)]


def test_more_processes_than_visible_modules_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "2")
    with install_fake_habana(device_count=8) as fake:
        get_backend()  # loads Habana's software: importing its HCCL calls initialize_distributed_hpu itself
        imported = fake.calls.count("initialize_distributed_hpu")
        with pytest.raises(RuntimeError, match="HABANA_VISIBLE_MODULES='2' lets this tenant use 1 Gaudi card"):
            hpu_dist.initialize_distributed(world_size=2, rank=0, local_rank=0, local_world_size=2)
        assert fake.calls.count("initialize_distributed_hpu") == imported  # refused before binding a card


def test_forking_after_the_kernel_acquired_a_gaudi_card_is_refused():
    with install_fake_habana(device_count=8):
        get_backend()  # the kernel has loaded habana_frameworks, and holds no card
        hpu_dist.check_fork_allowed()
        sys.modules["habana_frameworks.torch.hpu"].get_device_name()  # asking the name acquires a card
        with pytest.raises(hpu_dist.ForkAfterDeviceInitError, match="has already acquired a Gaudi card.*as a script"):
            hpu_dist.check_fork_allowed()


def test_emulated_gaudi_forks_freely_and_workers_get_fresh_cards(monkeypatch):
    monkeypatch.setenv("HPU_NB_MEMORY_LIMIT", "64MiB")
    hpu_dist.check_fork_allowed()
    parent = get_backend()
    kept = torch.ones(1024, device="hpu")
    in_use = parent.memory_stats()["InUse"]
    assert in_use >= 4096
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the forked worker
        try:
            stats = get_backend().memory_stats()
            os.write(write, json.dumps([stats["InUse"], stats["Limit"], kept.sum().item()]).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert json.loads(os.read(read, 1000)) == [0, 64 << 20, 1024.0]  # a fresh card; the parent's tensors still readable
    assert parent.memory_stats()["InUse"] == in_use


def test_a_worker_forked_after_backward_passes_runs_autograd_on_hpu():
    """torch's autograd engine refuses to run in a child forked after it started device threads. hpu_nb's device
    starts none (its backward passes run on the calling thread), so a notebook can train on one card, then fork
    workers for many: each runs its own backward passes, on hpu and on the CPU."""
    code = textwrap.dedent("""
        import os, torch
        from hpu_nb.runtime import distributed
        (torch.ones(2, device="hpu", requires_grad=True) * 2).sum().backward()
        (torch.ones(2, requires_grad=True) * 2).sum().backward()
        distributed.check_fork_allowed()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                for device in ("hpu", "cpu"):
                    w = torch.ones(3, device=device, requires_grad=True)
                    (w * w).sum().backward()
                    assert w.grad.tolist() == [2.0, 2.0, 2.0], w.grad
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print("child exit", os.waitstatus_to_exitcode(status))
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "child exit 0" in result.stdout, result.stderr[-2000:]


def test_deepspeed_environment_follows_the_backend(monkeypatch):
    for key in ("DEEPSPEED_USE_HPU", "PT_HPU_LAZY_ACC_PAR_MODE", "DS_ACCELERATOR"):
        monkeypatch.setenv(key, "recorded")  # so monkeypatch removes what the code under test sets
        monkeypatch.delenv(key)
    emulated = hpu_dist.deepspeed_environment()
    assert emulated["DS_ACCELERATOR"] == "hpu"  # DeepSpeed's own HPU accelerator drives the emulated Gaudi too
    with install_fake_habana(device_count=8):
        effective = hpu_dist.prepare_deepspeed_environment()
        assert effective["DEEPSPEED_USE_HPU"] == "true" and os.environ["PT_HPU_LAZY_ACC_PAR_MODE"] == "0"


# -- real 2-process runs on the emulated Gaudi, from a script ---------------------------------------------------------
@pytest.mark.timeout(150)
def test_two_process_ddp_fit_from_a_script(tmp_path):
    out = tmp_path / "ddp"
    result = run_fit(out, "--devices", "2", "--ckpt", str(tmp_path / "ddp.ckpt"))
    assert result.returncode == 0, result.stderr[-3000:]
    reports = rank_reports(out)
    assert [r["rank"] for r in reports] == [0, 1]
    assert {r["process_group_backend"] for r in reports} == {"hccl"}  # HCCL's semantics, over gloo when emulated
    assert {r["strategy"] for r in reports} == {"HPUParallelStrategy"}
    assert len({r["pid"] for r in reports}) == 2
    # the distributed sampler splits 64 samples: each rank sees its own half
    assert [r["samples_seen"] for r in reports] == [32, 32]
    assert reports[0]["first_index_sum"] != pytest.approx(reports[1]["first_index_sum"])
    assert reports[0]["metrics"]["rank_sum"] == 3.0  # sum over ranks 1 + 2
    assert reports[0]["metrics"]["train_loss"] == pytest.approx(reports[1]["metrics"]["train_loss"])
    assert all(r["max_in_use"] > 0 for r in reports)  # each rank's own emulated card was used

    # the 2-device checkpoint resumes on one device and keeps training from where it stopped
    single = run_fit(tmp_path / "single", "--devices", "1", "--resume", str(tmp_path / "ddp.ckpt"), "--epochs", "2")
    assert single.returncode == 0, single.stderr[-3000:]
    (resumed,) = rank_reports(tmp_path / "single")
    assert resumed["strategy"] == "SingleHPUStrategy" and resumed["world_size"] == 1
    assert resumed["global_step"] == 4 + 8 and resumed["samples_seen"] == 64


@pytest.mark.timeout(120)
def test_a_crashing_rank_fails_the_run_fast_with_its_error(tmp_path):
    result = run_fit(tmp_path / "crash", "--devices", "2", "--crash-rank", "1", "--crash-step", "2", timeout=100)
    assert result.returncode != 0
    assert "rank 1 exploded on purpose at step 2" in result.stderr
    assert not (tmp_path / "crash" / "rank0.json").exists()


def test_a_local_rank_beyond_the_strategy_s_devices_is_named_not_an_index_error(monkeypatch):
    from lightning.fabric.plugins.environments import LightningEnvironment

    monkeypatch.setenv("LOCAL_RANK", "1")
    strategy = HPUParallelStrategy(parallel_devices=[torch.device("hpu")], cluster_environment=LightningEnvironment())
    with pytest.raises(RuntimeError, match=r"has 1 device\(s\) per node \(hpu\), and local rank 1 asked for its own"):
        _ = strategy.root_device
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert strategy.root_device.type == "hpu"

"""Quiet output: a 2-card fit from forked workers (as from a notebook) and a profiled fit print Lightning's lines and
hpu_nb's, and no warning hpu_nb could have kept out (hpu_nb.core.noise lists the ones it drops)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hpu_nb.core import noise

ROOT = Path(__file__).resolve().parents[2]

# What a fit is expected to print on stderr: Lightning's own lines and hpu_nb's one line (and the profiler's pointer).
EXPECTED = (
    r"HPU: using \d+ of \d+ x \w+ \(emulated Gaudi on the CPU\)",
    r"Initializing distributed: GLOBAL_RANK: \d, MEMBER: \d/\d",
    r"-+",
    r"distributed_backend=hccl",
    r"All distributed processes registered\. Starting with \d processes",
    r"`Trainer\.fit` stopped: `max_epochs=1` reached\.",
    r"HPUProfiler: trace .*\.pt\.trace\.json; profiler\.summary\(\) for its report, profiler\.show\(\) to view it\.",
    r"",
    # Lightning's own hint wherever SLURM's `srun` is installed but the run is not under it (it prints it on a GPU
    # too): `make test-cluster` installs SLURM on the machine that runs the suite.
    r".*slurm\.py:\d+: The `srun` command is available on your system but is not used\. HINT: .*",
)

FIT = """
import sys
sys.path.insert(0, {root!r})
import lightning as L
import hpu_nb
from tests.dist_scripts.fit import Model, data, make_strategy
L.seed_everything(7, verbose=False)
kwargs = {kwargs}
trainer = L.Trainer(accelerator="hpu", max_epochs=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, **kwargs)
trainer.fit(Model(), data())
"""

RUNS = {
    # forked workers, as Lightning starts them from a notebook
    "ddp": 'dict(devices=2, strategy=make_strategy("auto", start_method="fork"))',
    "deepspeed zero-2": 'dict(devices=2, strategy=make_strategy("ds:2", start_method="fork"))',
    "deepspeed zero-3 offload": 'dict(devices=2, strategy=make_strategy("ds:3:offload", start_method="fork"))',
    "profiler": 'dict(devices=1, profiler=__import__("hpu_nb").HPUProfiler(dirpath={tmp!r}))',
    # c10's CPUAllocator.cpp note about blocks allocated before the profiling started
    "profiler memory": 'dict(devices=1, profiler=hpu_nb.HPUProfiler(dirpath={tmp!r}, profile_memory=True))',
}


FABRIC = """
import torch, lightning as L
import hpu_nb
from hpu_nb.core.fabric.strategies import HPUParallelStrategy

def train(fabric, model):
    model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for _ in range(3):
        fabric.backward(model(torch.randn(16, 8, device=fabric.device)).pow(2).mean())
        optimizer.step()
    return model.state_dict()

fabric = L.Fabric(accelerator="hpu", devices=2, strategy=HPUParallelStrategy(start_method="fork"))
fabric.launch(train, torch.nn.Linear(8, 1))
"""


@pytest.mark.timeout(600)
@pytest.mark.parametrize("run", list(RUNS))
def test_a_fit_prints_no_warning_hpu_nb_could_prevent(run, tmp_path):
    kwargs = RUNS[run].format(tmp=str(tmp_path))
    lines = _stderr_lines(textwrap.dedent(FIT.format(root=str(ROOT), kwargs=kwargs)), tmp_path)
    unexpected = [line for line in lines if not any(re.fullmatch(p, line) for p in EXPECTED)]
    assert unexpected == [], "\n".join(unexpected)
    assert any(line.startswith("HPU: using") for line in lines)  # hpu_nb's line is still there


@pytest.mark.timeout(300)
def test_fabric_on_two_forked_cards_prints_no_warning_hpu_nb_could_prevent(tmp_path):
    lines = _stderr_lines(FABRIC, tmp_path)
    unexpected = [line for line in lines if not any(re.fullmatch(p, line) for p in EXPECTED)]
    assert unexpected == [], "\n".join(unexpected)
    assert any(line.startswith("All distributed processes registered") for line in lines)


def _stderr_lines(script: str, cwd: Path) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPU_NB_", "PT_HPU_"))}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=250,
                          cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr.splitlines()


def test_native_stderr_without_drops_only_the_named_lines_and_keeps_the_order(capfd):
    with noise.native_stderr_without(r"^drop me") as dropped:
        os.write(2, b"first\ndrop me: C++ noise\nsecond\n")
        os.write(2, b"no newline at the end")
    os.write(2, b"\nafter\n")
    assert capfd.readouterr().err == "first\nsecond\nno newline at the end\nafter\n"
    assert dropped == ["drop me: C++ noise\n"]


def test_once_native_message_stops_catching_after_the_message(capfd):
    once = noise.OnceNativeMessage(r"^once", max_calls=5)
    with once():
        os.write(2, b"kept\n")
    assert once.calls_left == 4  # not seen yet: still catching
    with once():
        os.write(2, b"once per process\n")
    assert once.calls_left == 0
    with once():
        os.write(2, b"once per process\n")  # no longer caught: a second one is someone else's
    assert capfd.readouterr().err == "kept\nonce per process\n"


def test_deepspeed_gets_the_current_collective_names():
    import torch.distributed as dist

    ds_comm = pytest.importorskip("deepspeed.comm.comm")

    class Backend:  # DeepSpeed's TorchBackend as it picks its functions
        def __init__(self) -> None:
            self.all_gather_function = dist.all_gather_into_tensor
            self.reduce_scatter_function = dist.reduce_scatter_tensor

    saved = getattr(ds_comm, "cdb", None)
    ds_comm.cdb = Backend()
    try:
        if not hasattr(dist, "all_gather_single"):  # torch before 2.10: the names DeepSpeed picks are the current ones
            assert not noise.use_current_collective_names()
            assert ds_comm.cdb.all_gather_function is dist.all_gather_into_tensor
            return
        assert noise.use_current_collective_names()
        assert ds_comm.cdb.all_gather_function is dist.all_gather_single
        assert ds_comm.cdb.reduce_scatter_function is dist.reduce_scatter_single
        assert not noise.use_current_collective_names()  # already the current ones
    finally:
        ds_comm.cdb = saved

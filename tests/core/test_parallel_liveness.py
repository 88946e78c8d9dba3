"""A stuck or interrupted multi-device run ends, names the rank that did not answer, and leaves no process behind.

Real 2-process runs on the emulated Gaudi (tests/dist_scripts/fit.py): one rank sleeps ten minutes in its training
step. The collective timeout is set short through HPU_NB_COLLECTIVE_TIMEOUT; the only time limits here are generous
safety nets (RUN_LIMIT_S) so a regression fails instead of hanging the suite. After every run the process table is
checked: no rank, and no process at all started for that run, may be left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.strategies.ddp import DDPStrategy

from hpu_nb.core.strategies.deepspeed import HPUDeepSpeedStrategy
from hpu_nb.core.strategies.fsdp import HPUFSDPStrategy
from hpu_nb.core.strategies.parallel import HPUParallelStrategy
from hpu_nb.core.strategy_parts import liveness

ROOT = Path(__file__).resolve().parents[2]
FIT = ROOT / "tests" / "dist_scripts" / "fit.py"
COLLECTIVE_TIMEOUT_S = int(os.environ.get("HPU_NB_TEST_COLLECTIVE_TIMEOUT", "20"))
RUN_LIMIT_S = float(os.environ.get("HPU_NB_TEST_RUN_LIMIT", "400"))  # a safety net, not a measurement



def start_fit(out: Path, *args: str, collective_timeout: float = COLLECTIVE_TIMEOUT_S) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), liveness.TIMEOUT_ENV: str(collective_timeout)}
    for key in ("HPU_NB_BACKEND", "WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT", liveness.PARENT_PID_ENV):
        env.pop(key, None)
    out.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, str(FIT), "--out", str(out), "--devices", "2", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(out.parent),
        # as from a terminal: a test run started in the background of a non-interactive shell (`make test &`)
        # ignores SIGINT, and its children would inherit that and never see the interrupt this file sends
        preexec_fn=_interruptible,
    )


def _interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    try:
        _, stderr = proc.communicate(timeout=RUN_LIMIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, stderr = proc.communicate()
        pytest.fail(f"the run did not end within {RUN_LIMIT_S:.0f} s:\n{stderr[-3000:]}")
    return proc.returncode, stderr


def wait_for(path: Path, proc: subprocess.Popen) -> int:
    """The pid written to `path` by the run (a rank says it is stuck, or that it started)."""
    deadline = time.monotonic() + RUN_LIMIT_S
    while not path.exists() or not path.read_text():
        if proc.poll() is not None:
            pytest.fail(f"the run ended before {path.name} appeared:\n{proc.stderr.read()[-3000:]}")
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.2)
    return int(path.read_text())


def assert_no_process_left(out: Path) -> None:
    """No process of this run is alive: not the ranks (pid files), not anything whose command line names its folder."""
    pids = {int(p.read_text()) for p in out.glob("*.pid") if p.read_text()}
    deadline = time.monotonic() + 30  # the kernel may take a moment to deliver a parent-death SIGKILL
    while True:
        alive = [pid for pid in pids if _alive(pid)]
        alive += [p.pid for p in psutil.process_iter(["cmdline"]) if str(out) in " ".join(p.info["cmdline"] or [])
                  and _alive(p.pid)]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for pid in alive:
        with pytest.raises(psutil.NoSuchProcess):
            psutil.Process(pid).kill()  # clean up, then fail
    assert not alive, f"processes left behind: {alive}"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# -- the timeout ----------------------------------------------------------------------------------------------------
def test_the_collective_timeout_defaults_to_five_minutes_and_is_configurable(monkeypatch):
    monkeypatch.delenv(liveness.TIMEOUT_ENV, raising=False)
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")  # FSDP needs eager mode
    assert HPUParallelStrategy()._timeout == timedelta(minutes=5)
    assert HPUFSDPStrategy()._timeout == timedelta(minutes=5)  # Lightning's 30-minute default means "not set"
    assert HPUDeepSpeedStrategy()._timeout == timedelta(minutes=5)
    assert HPUParallelStrategy(timeout=timedelta(seconds=42))._timeout == timedelta(seconds=42)
    assert HPUParallelStrategy(timeout=timedelta(minutes=30))._timeout == timedelta(minutes=30)  # explicit: kept
    monkeypatch.setenv(liveness.TIMEOUT_ENV, "90")
    assert HPUParallelStrategy()._timeout == timedelta(seconds=90)
    assert HPUParallelStrategy(timeout=timedelta(seconds=7))._timeout == timedelta(seconds=7)
    monkeypatch.setenv(liveness.TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError, match="HPU_NB_COLLECTIVE_TIMEOUT='soon' is not a number of seconds"):
        HPUParallelStrategy()._timeout  # noqa: B018
    monkeypatch.setenv(liveness.TIMEOUT_ENV, "1e300")  # was a raw OverflowError from timedelta
    with pytest.raises(ValueError, match="HPU_NB_COLLECTIVE_TIMEOUT='1e300' is more than a year"):
        HPUParallelStrategy()._timeout  # noqa: B018


def test_lightning_still_defaults_timeout_to_its_module_constant():
    """Tripwire: `timeout` left unset is recognised by identity with Lightning's default_pg_timeout."""
    import inspect

    from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy

    for cls in (DDPStrategy, FSDPStrategy, DeepSpeedStrategy):
        assert inspect.signature(cls.__init__).parameters["timeout"].default is default_pg_timeout, cls
    assert issubclass(HPUFSDPStrategy, FSDPStrategy) and issubclass(HPUDeepSpeedStrategy, DeepSpeedStrategy)


def test_a_rank_that_crashes_keeps_its_own_error(tmp_path):
    """Only a failed collective is explained as a stuck rank; a rank's own exception stays as it is."""
    progress = liveness.RankProgress(rank=0, world_size=2, timeout=timedelta(seconds=10))
    with pytest.raises(RuntimeError), progress.track("training_step"):
        raise RuntimeError("my own bug, with a timeout in its text")
    assert progress.explain(RuntimeError("my own bug, with a timeout in its text")) is None


# -- the script launcher --------------------------------------------------------------------------------------------
def test_script_launcher_a_stuck_rank_ends_the_run_named(tmp_path):
    out = tmp_path / "run"
    proc = start_fit(out, "--stuck-rank", "1", "--stuck-step", "2")
    stuck = wait_for(out / "stuck1.pid", proc)
    code, stderr = finish(proc)
    assert code != 0
    assert "StuckRankError" in stderr
    assert f"Rank 1 (pid {stuck} on" in stderr and "did not answer: it has been in training_step #3" in stderr
    assert f"wait at most {COLLECTIVE_TIMEOUT_S} s" in stderr and "HPU_NB_COLLECTIVE_TIMEOUT" in stderr
    assert_no_process_left(out)


def test_script_launcher_a_stuck_rank_zero_is_named_by_the_others(tmp_path):
    out = tmp_path / "run"
    proc = start_fit(out, "--stuck-rank", "0", "--stuck-step", "2")
    stuck = wait_for(out / "stuck0.pid", proc)
    code, stderr = finish(proc)
    assert code != 0
    assert f"Rank 0 (pid {stuck} on" in stderr and "did not answer" in stderr
    assert_no_process_left(out)


def test_script_launcher_rank_zero_honours_sigterm_inside_a_collective(tmp_path):
    out = tmp_path / "run"
    proc = start_fit(out, "--stuck-rank", "1", "--stuck-step", "2", collective_timeout=3600)  # only SIGTERM ends it
    wait_for(out / "stuck1.pid", proc)
    time.sleep(3)  # rank 0 is now waiting inside the gradient all-reduce for rank 1
    rank0 = int((out / "launcher.pid").read_text())
    assert rank0 == proc.pid
    os.kill(rank0, signal.SIGTERM)
    code, _stderr = finish(proc)
    assert code != 0
    assert_no_process_left(out)


# -- the fork launcher ----------------------------------------------------------------------------------------------
def test_fork_launcher_a_stuck_rank_ends_the_run_named(tmp_path):
    out = tmp_path / "run"
    proc = start_fit(out, "--start-method", "fork", "--stuck-rank", "1", "--stuck-step", "2")
    stuck = wait_for(out / "stuck1.pid", proc)
    code, stderr = finish(proc)
    assert code != 0
    assert "StuckRankError" in stderr and f"Rank 1 (pid {stuck} on" in stderr
    assert_no_process_left(out)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_fork_launcher_leaves_no_worker_after_an_interrupt(tmp_path, signum):
    out = tmp_path / "run"
    proc = start_fit(out, "--start-method", "fork", "--stuck-rank", "1", "--stuck-step", "2", collective_timeout=3600)
    wait_for(out / "stuck1.pid", proc)
    workers = [wait_for(out / f"rank{r}.pid", proc) for r in (0, 1)]
    assert all(psutil.Process(w).ppid() == proc.pid for w in workers)  # forked by the launching process
    os.kill(proc.pid, signum)
    code, _ = finish(proc)
    assert code != 0
    assert_no_process_left(out)


def test_lightning_launcher_internals_we_build_on_are_unchanged():
    """Tripwire: the launchers subclass Lightning's and rely on these details; an upgrade that changes them fails
    here."""
    import inspect

    from lightning.fabric.strategies.launchers import multiprocessing as fabric_multiprocessing
    from lightning.fabric.strategies.launchers import subprocess_script as fabric_script
    from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher
    from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
    from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector

    # ScriptLivenessMixin.launch replaces both script launchers' launch: these statements, in this order, and no other
    replaced = ["self.cluster_environment.validate_settings(num_devices=self.num_processes, num_nodes=self.num_nodes)",
                "if not self.cluster_environment.creates_processes_externally:", "self._call_children_scripts()",
                "_launch_process_observer(self.procs)", "_set_num_threads_if_needed(num_processes=self.num_processes)",
                "return function(*args, **kwargs)"]
    for launcher in (_SubprocessScriptLauncher, fabric_script._SubprocessScriptLauncher):
        body = inspect.getsource(launcher.launch).split('"""')[-1]
        assert [line.strip() for line in body.splitlines() if line.strip()] == replaced, launcher
        children = inspect.getsource(launcher._call_children_scripts)
        assert "env_copy = os.environ.copy()" in children and "self.procs.append(" in children  # our env var
    fork_launch = inspect.getsource(_MultiProcessingLauncher.launch)
    assert "self.procs = process_context.processes" in fork_launch and "self._wrapping_function" in fork_launch
    assert list(inspect.signature(_MultiProcessingLauncher._wrapping_function).parameters)[:4] == [
        "self", "process_idx", "trainer", "function"
    ]
    assert list(inspect.signature(fabric_multiprocessing._MultiProcessingLauncher._wrapping_function).parameters)[
        :3] == ["self", "process_idx", "function"]
    # WorkerWatch finds the workers where multiprocessing keeps its live children (torch starts them as Processes)
    import multiprocessing.process

    import torch.multiprocessing

    assert isinstance(multiprocessing.process._children, set)
    assert "process.start()" in inspect.getsource(torch.multiprocessing.start_processes)
    # Lightning keeps a SIGTERM handler installed before fit (ours) and calls it after its own
    assert "sigterm_handlers.append(signal.getsignal(signal.SIGTERM))" in inspect.getsource(
        _SignalConnector.register_signal_handlers
    )


_IGNORED_TIMEOUT = """
import time
from datetime import timedelta
from torch.distributed import TCPStore
from hpu_nb.core.strategy_parts import liveness
liveness.BACKSTOP_GRACE_S = 1.0
store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # the job's store, as rank 0 hosts it
progress = liveness.RankProgress(rank=0, world_size=2, timeout=timedelta(seconds=2))
progress.start("127.0.0.1", store.port)
with progress.track("training_step"), progress.track("barrier"):
    time.sleep(600)  # a collective whose backend never gives up
"""


def test_a_collective_that_outlives_its_timeout_ends_the_rank(tmp_path):
    """The backstop, for a backend that would not honour its timeout: the rank says why and ends."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _IGNORED_TIMEOUT], stderr=subprocess.PIPE, text=True, env=env)
    code, stderr = finish(proc)
    assert code == 1
    assert "the collective backend did not end the wait at its 2 s timeout" in stderr
    assert "rank 0 waited for the other ranks in barrier (in training_step #1)" in stderr
    assert "Rank 1 sent no progress report" in stderr

"""Every launcher hpu_nb returns carries the same liveness: a stuck rank under Fabric (DDP and FSDP from a script, DDP
forked as from a notebook) and under DeepSpeed (script, fork) ends the run, named, with no process left; a stopped
rank (SIGSTOP) is ended at once, not after torch's 30 s grace; a killed rank is said to have died, and how.

Real 2-process runs on the emulated Gaudi (tests/dist_scripts/fit.py and fabric_fit.py), started by one fixture a few
at a time so their waits overlap (the suite stays short): each test then reads its own run. The collective timeout is
short (HPU_NB_COLLECTIVE_TIMEOUT); the only time limit is test_parallel_liveness's generous safety net. After every
run the process table is checked: no rank, and no process at all started for that run, may be left.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pytest

from hpu_nb.core.strategy_parts import liveness, rank_processes
from tests.core.test_parallel_liveness import COLLECTIVE_TIMEOUT_S, ROOT, RUN_LIMIT_S, assert_no_process_left

SCRIPTS = ROOT / "tests" / "dist_scripts"
STUCK = ("--stuck-rank", "1", "--stuck-step", "1")
RUNS = {  # name: (script, arguments)
    "fabric_script": ("fabric_fit.py", STUCK),
    "fabric_fsdp_script": ("fabric_fit.py", (*STUCK, "--strategy", "hpu_fsdp")),
    "fabric_fork": ("fabric_fit.py", (*STUCK, "--start-method", "fork")),
    # no sync_dist logging: rank 0's first collective after the block is DeepSpeed's own (ZeRO-2's gradient reduce in
    # backward, ZeRO-3's parameter gather in forward), on the process groups DeepSpeed makes itself
    "deepspeed_script": ("fit.py", (*STUCK, "--strategy", "ds:2", "--no-sync-log")),
    "deepspeed_fork": ("fit.py", (*STUCK, "--strategy", "ds:3", "--no-sync-log", "--start-method", "fork")),
    "fork_stopped_rank": ("fit.py", (*STUCK, "--start-method", "fork", "--stuck-how", "stop")),
    "script_killed_rank": ("fit.py", (*STUCK, "--stuck-how", "kill")),
}


# Runs going on together: their waits overlap, but on a small shared machine too many at once start so slowly that a
# rank misses the rendezvous (which the collective timeout bounds too).
CONCURRENT_RUNS = int(os.environ.get("HPU_NB_TEST_CONCURRENT_RUNS", "2"))


@dataclass
class Run:
    """One 2-process run, its stderr read by a thread (the runs go on together)."""

    out: Path
    proc: subprocess.Popen
    on_end: threading.Semaphore
    stderr: list[str] = field(default_factory=list)
    ended_at: float | None = None

    def __post_init__(self) -> None:
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        self.stderr.append(self.proc.stderr.read())
        self.proc.wait()
        self.ended_at = time.time()
        self.on_end.release()

    def finish(self) -> tuple[int, str]:
        self._reader.join(timeout=RUN_LIMIT_S)
        if self._reader.is_alive():
            self.proc.kill()
            self._reader.join()
            pytest.fail(f"the run did not end within {RUN_LIMIT_S:.0f} s:\n{''.join(self.stderr)[-3000:]}")
        return self.proc.returncode, "".join(self.stderr)

    def pid(self, name: str) -> int:
        path = self.out / name
        if not path.exists():  # the run ended before that point (a rendezvous missed on a crowded machine...)
            pytest.fail(f"the run wrote no {name}:\n{''.join(self.stderr)[-3000:]}")
        return int(path.read_text())

    def seconds_after_stuck(self) -> float:
        """From the moment the rank got stuck (its pid file written) to the end of the run."""
        assert self.ended_at is not None
        return self.ended_at - (self.out / "stuck1.pid").stat().st_mtime


def start_run(out: Path, script: str, args: tuple[str, ...], on_end: threading.Semaphore) -> Run:
    env = {**os.environ, "PYTHONPATH": str(ROOT), liveness.TIMEOUT_ENV: str(COLLECTIVE_TIMEOUT_S)}
    for key in ("HPU_NB_BACKEND", "WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT", rank_processes.PARENT_PID_ENV):
        env.pop(key, None)
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPTS / script), "--out", str(out), "--devices", "2", *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=str(out.parent),
    )
    return Run(out, proc, on_end)


class Runs:
    """The runs named, started in order, CONCURRENT_RUNS at a time, by a thread; `runs[name]` waits until that one
    started."""

    def __init__(self, names: list[str], folder: Callable[[str], Path]) -> None:
        self._names, self._folder = names, folder
        self._slots = threading.Semaphore(CONCURRENT_RUNS)
        self._started: dict[str, Run] = {}
        self._ready = {name: threading.Event() for name in names}
        self._stopping = False
        self._thread = threading.Thread(target=self._start_all, daemon=True)
        self._thread.start()

    def _start_all(self) -> None:
        for name in self._names:
            script, args = RUNS[name]
            self._slots.acquire()
            if not self._stopping:
                self._started[name] = start_run(self._folder(name), script, args, self._slots)
            self._ready[name].set()

    def __getitem__(self, name: str) -> Run:
        self._ready[name].wait()
        return self._started[name]

    def close(self) -> None:
        self._stopping = True
        for run in self._started.values():  # a test that failed early: nothing may outlive the module
            if run.proc.poll() is None:
                run.proc.kill()
            run.finish()
            assert_no_process_left(run.out)


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    """The runs this session's tests of this module read (each test is parametrized by its run's `name`)."""
    wanted = {item.callspec.params.get("name") for item in request.session.items  # notebooks (nbmake) have no module
              if getattr(item, "module", None) is request.module and hasattr(item, "callspec")}
    started = Runs([name for name in RUNS if name in wanted], lambda name: tmp_path_factory.mktemp(name) / "run")
    yield started
    started.close()


def _measured(name: str, run: Run) -> None:
    print(f"{name}: ended {run.seconds_after_stuck():.1f} s after rank 1 got stuck"
          f" (collective timeout {COLLECTIVE_TIMEOUT_S} s)")


# -- Fabric -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["fabric_script", "fabric_fsdp_script"])
def test_fabric_script_a_stuck_rank_ends_the_run_named_and_leaves_no_orphan(runs, name):
    """Fabric's `fabric.launch()` returns before the training runs: rank 0 keeps its ranks in check for its whole life
    (was: Lightning's plain launcher, gloo's raw timeout, and the stuck rank left running as an orphan)."""
    run = runs[name]
    code, stderr = run.finish()
    assert code == 1, stderr[-3000:]  # the StuckRankError, not an abort (134) nor a SIGKILL from Lightning's observer
    assert "StuckRankError" in stderr
    assert (f"Rank 1 (pid {run.pid('stuck1.pid')} on" in stderr
            and "did not answer: it has been in the script's own code (no Fabric call) for" in stderr)
    assert "rank 0 waited for the other ranks in backward" in stderr
    assert f"wait at most {COLLECTIVE_TIMEOUT_S} s" in stderr
    assert_no_process_left(run.out)
    _measured(name, run)


@pytest.mark.parametrize("name", ["fabric_fork"])
def test_fabric_fork_as_in_a_notebook_a_stuck_rank_is_named(runs, name):
    run = runs[name]
    code, stderr = run.finish()
    assert code != 0
    assert "StuckRankError" in stderr and f"Rank 1 (pid {run.pid('stuck1.pid')} on" in stderr, stderr[-3000:]
    workers = {run.pid("rank0.pid"), run.pid("rank1.pid")}
    assert run.pid("launcher.pid") not in workers  # forked workers, as in a notebook
    assert_no_process_left(run.out)
    _measured(name, run)


# -- DeepSpeed --------------------------------------------------------------------------------------------------------
NAMED_WITHIN_S = 10  # past the collective timeout: how late a stuck rank may be named


def _stuck_for_s(stderr: str) -> int:
    """How long the stuck rank had been blocked when it was named: the time the diagnosis itself reports (from the
    stuck rank's own last progress report, at most a report interval old), not the run's wall-clock time."""
    found = re.search(r"Rank 1 \(pid \d+ on [^)]*\) did not answer: it has been in training_step #2 \(in [^)]*\) for"
                      r" (\d+) s", stderr)
    assert found, stderr[-3000:]
    return int(found.group(1))


@pytest.mark.parametrize("name", ["deepspeed_script", "deepspeed_fork"])
def test_deepspeed_a_stuck_rank_is_named_within_the_collective_timeout(runs, name):
    """DeepSpeed's strategy skips the parallel mixin's setup_environment: it starts the progress reports itself.

    Was: ~75 s after the block with a 15 s timeout (ZeRO-2: DeepSpeed's gradient reduce ran on a group DeepSpeed made
    without a timeout, torch's 30 minutes, so only the backstop at timeout + 60 s named it); ZeRO-3's parameter gather
    in forward failed at the timeout with a bare gloo error, naming no rank."""
    run = runs[name]
    code, stderr = run.finish()
    assert code != 0
    assert "StuckRankError" in stderr, stderr[-3000:]
    assert f"Rank 1 (pid {run.pid('stuck1.pid')} on" in stderr
    assert "did not end the wait at its" not in stderr  # the backend's own timeout ended the wait, not the backstop
    stuck_for = _stuck_for_s(stderr)
    print(f"{name}: named when rank 1 had been stuck {stuck_for} s (collective timeout {COLLECTIVE_TIMEOUT_S} s)")
    assert COLLECTIVE_TIMEOUT_S - 2 <= stuck_for <= COLLECTIVE_TIMEOUT_S + NAMED_WITHIN_S, stderr[-3000:]
    assert_no_process_left(run.out)
    _measured(name, run)


def test_deepspeed_makes_its_own_groups_with_the_collective_timeout(tmp_path):
    """DeepSpeed's comm layer made its groups (its clone of the world group, where ZeRO reduces the gradients) with
    torch's default timeout, 30 minutes; they now wait what the world group waits. One process, in a child."""
    code = (
        "import datetime, os, torch.distributed as dist, deepspeed\n"
        "from deepspeed.utils import groups\n"
        "from hpu_nb.core.strategies.deepspeed import _deepspeed_groups_wait_at_most\n"
        f"os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT='{_free_port()}', RANK='0', WORLD_SIZE='1',"
        " LOCAL_RANK='0')\n"
        "timeout = datetime.timedelta(seconds=17)\n"
        "deepspeed.init_distributed('gloo', timeout=timeout)\n"
        "_deepspeed_groups_wait_at_most(timeout)\n"
        "group = groups._clone_world_group()\n"
        "print(group._get_backend(__import__('torch').device('cpu')).options._timeout.total_seconds())\n"
        "dist.destroy_process_group()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                          cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(done.stdout.strip().splitlines()[-1]) == 17.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- a stopped rank, a killed rank ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["fork_stopped_rank"])
def test_fork_launcher_a_stopped_rank_is_ended_at_once(runs, name):
    """A SIGSTOPped rank ignores SIGTERM until continued: torch's launcher waited its 30 s grace, then SIGKILLed it
    (and said so); hpu_nb's watch sends SIGTERM and SIGCONT as soon as rank 0 has failed."""
    run = runs[name]
    code, stderr = run.finish()
    assert code != 0
    stopped = run.pid("stuck1.pid")
    assert f"Rank 1 (pid {stopped} on" in stderr and "it is stopped (SIGSTOP" in stderr, stderr[-3000:]
    assert "Unable to shutdown process" not in stderr  # torch's word for "waited 30 s, then SIGKILL"
    assert_no_process_left(run.out)
    _measured(name, run)


@pytest.mark.parametrize("name", ["script_killed_rank"])
def test_a_killed_rank_is_said_to_have_died_and_how(runs, name):
    """Was: "did not answer: it has been in between steps for 0 s". The launching rank 0 notes how it ended."""
    run = runs[name]
    code, stderr = run.finish()
    assert code != 0
    killed = run.pid("stuck1.pid")
    assert (f"Rank 1 (pid {killed} on {socket.gethostname()}) died (killed by SIGKILL; its last report had it in"
            in stderr), stderr[-3000:]
    assert "between steps for 0 s" not in stderr
    assert_no_process_left(run.out)


# -- the pieces -------------------------------------------------------------------------------------------------------
def test_a_rank_outside_every_phase_reports_how_long_it_has_been_there():
    """The idle time counts from the end of the last tracked phase (it was always 0 s)."""
    progress = liveness.RankProgress(rank=0, world_size=2, timeout=timedelta(seconds=20),
                                     idle_phase="the script's own code (no Fabric call)")
    with progress.track("backward"):
        pass
    progress._idle_since -= 42  # as if the last phase ended 42 s ago
    report = progress.snapshot()
    assert report["phase"] == "the script's own code (no Fabric call)" and report["in_phase_s"] >= 42


def test_a_collective_timing_out_in_any_phase_is_a_communication_failure():
    """ZeRO-3 gathers parameters inside training_step (no collective phase of ours): gloo's time-out there names the
    stuck rank too; other words about time-outs count only inside a collective phase."""
    gloo = RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:129] Timed out waiting"
                        " 15000ms for send operation to complete")
    assert liveness.is_communication_failure(gloo, "training_step")
    assert not liveness.is_communication_failure(RuntimeError("request timed out"), "training_step")
    assert liveness.is_communication_failure(RuntimeError("request timed out"), "backward")


def test_a_process_is_described_by_how_it_ended():
    assert rank_processes.describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert rank_processes.describe_exit(3) == "exited with code 3"


def test_stop_processes_ends_a_stopped_process_without_waiting_for_a_kill():
    """SIGTERM alone does not reach a stopped process; SIGCONT with it does (its handler runs: exit code 15 here)."""
    code = ("import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(15))\n"
            "print('ready', flush=True)\ntime.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"  # its handler is installed
    os.kill(proc.pid, signal.SIGSTOP)
    rank_processes.stop_processes([proc.pid], grace=60)
    assert proc.wait(timeout=10) == 15  # ended by its SIGTERM handler, not by the SIGKILL after the grace

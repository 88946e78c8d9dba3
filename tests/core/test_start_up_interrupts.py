"""Ctrl-C at any moment of a 2-card fit's start-up ends every process (issue 35, item 5).

A terminal's Ctrl-C sends SIGINT to the whole process group: the process the user started and every rank. The run
(tests/dist_scripts/start_up_pause.py) pauses chosen ranks at chosen moments of start-up and says so in files, so the
interrupt lands at a known moment, not after a sleep that races the start-up. Was: a rank still starting when
interrupted never joins, and rank 0, waiting in C++ (torch's init_process_group) where no Python handler runs, stayed
alive for 30 s, then ended with "still blocked" (or, without hpu_nb's guard, at the collective timeout).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from hpu_nb.core.strategy_parts import liveness
from hpu_nb.core.strategy_parts.interrupts import stopped_message
from tests.core.test_parallel_liveness import RUN_LIMIT_S, assert_no_process_left, finish

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "dist_scripts" / "start_up_pause.py"
ONE_LINE = stopped_message(None)
LIGHTNING_LINE = "Detected KeyboardInterrupt, attempting graceful shutdown"  # Lightning's, for a script's Ctrl-C


def _start(out: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for key in ("HPU_NB_BACKEND", "WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT", liveness.PARENT_PID_ENV,
                liveness.TIMEOUT_ENV):
        env.pop(key, None)
    out.mkdir(parents=True, exist_ok=True)
    # a session of its own, as a terminal's foreground job: Ctrl-C is SIGINT to its process group
    return subprocess.Popen([sys.executable, str(SCRIPT), str(out), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=str(out.parent), start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_file(path: Path, proc: subprocess.Popen) -> str:
    deadline = time.monotonic() + RUN_LIMIT_S
    while not path.exists() or not path.read_text():
        if proc.poll() is not None:
            pytest.fail(f"the run ended before {path.name} appeared:\n{proc.stderr.read()[-3000:]}")
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.1)
    return path.read_text()


def _wait_in_init_process_group(out: Path, rank: int, proc: subprocess.Popen) -> None:
    """Until `rank` waits inside torch's init_process_group: rank 0 once its store listens (it then waits there for
    the other ranks), another rank once it is connected to that store."""
    pid, port = (int(v) for v in _wait_file(out / f"joining{rank}.txt", proc).split())
    deadline = time.monotonic() + RUN_LIMIT_S
    while True:
        connections = psutil.Process(pid).net_connections(kind="tcp")
        if rank == 0 and any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in connections):
            return
        if rank != 0 and any(c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
                             for c in connections):
            return
        assert proc.poll() is None and time.monotonic() < deadline, f"rank {rank} never waited in init_process_group"
        time.sleep(0.1)


def _interrupt(proc: subprocess.Popen) -> tuple[int, str]:
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
    return finish(proc)


def test_rank_zero_waiting_to_join_for_a_rank_still_starting_ends_at_once_with_the_one_line(tmp_path):
    """The reported case: rank 1 is still starting (here: paused before it joins) and rank 0 waits for it in
    init_process_group: rank 0 stops rank 1 and ends at once, its last line the one interrupt line."""
    out = tmp_path / "run"
    proc = _start(out, "--pause", "1:before_join")
    _wait_file(out / "paused-before_join-1.pid", proc)
    _wait_in_init_process_group(out, 0, proc)
    code, stderr = _interrupt(proc)
    assert code == 128 + signal.SIGINT, stderr[-3000:]
    assert stderr.rstrip().endswith(ONE_LINE), stderr[-3000:]
    assert "still blocked" not in stderr  # was: alive 30 s, then "hpu_nb: rank 0 ... still blocked 30 s after a SIGINT"
    assert_no_process_left(out)


def test_ranks_interrupted_after_joining_before_the_first_step_end_as_a_scripts_interrupt_does(tmp_path):
    """The process group exists, no step ran (both ranks paused in the model's setup): rank 0 raises KeyboardInterrupt
    as in any script (Lightning's line) and stops the other rank."""
    out = tmp_path / "run"
    proc = _start(out, "--pause", "0:after_join", "--pause", "1:after_join")
    # both joined and paused in the model's setup: the process group exists, no step ran
    _wait_file(out / "paused-after_join-0.pid", proc)
    _wait_file(out / "paused-after_join-1.pid", proc)
    code, stderr = _interrupt(proc)
    assert code != 0 and LIGHTNING_LINE in stderr, stderr[-3000:]
    assert_no_process_left(out)


def test_rank_zero_interrupted_before_it_joins_while_rank_one_waits_in_init_process_group(tmp_path):
    """Rank 1 waits in init_process_group for rank 0's store, where it cannot act on the interrupt; rank 0 (paused
    before joining) raises KeyboardInterrupt and ends it."""
    out = tmp_path / "run"
    proc = _start(out, "--pause", "0:before_join")
    _wait_file(out / "paused-before_join-0.pid", proc)
    _wait_file(out / "rank1.pid", proc)  # rank 1 started; it joins and waits for rank 0's store
    _wait_file(out / "joining1.txt", proc)
    code, stderr = _interrupt(proc)
    assert code != 0 and LIGHTNING_LINE in stderr, stderr[-3000:]
    assert_no_process_left(out)


def test_forked_ranks_interrupted_while_one_waits_to_join_end_with_the_one_line(tmp_path):
    """The notebook's launcher (fork): rank 0's worker waits in init_process_group, rank 1's is paused before it joins;
    the launching process ends both after its grace and the fit raises FitInterrupted with the one line."""
    out = tmp_path / "run"
    proc = _start(out, "--start-method", "fork", "--pause", "1:before_join")
    _wait_file(out / "paused-before_join-1.pid", proc)
    _wait_in_init_process_group(out, 0, proc)
    code, stderr = _interrupt(proc)
    assert code != 0 and stderr.rstrip().endswith(ONE_LINE), stderr[-3000:]
    assert_no_process_left(out)


_SIGTERM_WHILE_EXITING = """
import atexit, os, signal, time
atexit.register(lambda: (os.kill(os.getpid(), signal.SIGTERM), time.sleep(0.2), print("exit handler finished")))
from hpu_nb.core.strategy_parts import rank_processes
rank_processes.exit_on_sigterm()  # as a launched rank does, after torch's and Lightning's imports registered theirs
"""


def test_a_rank_stopped_while_it_exits_finishes_its_exit_quietly(tmp_path):
    """Interrupted, a rank exits on its own (Lightning's KeyboardInterrupt handling) while rank 0 stops it with SIGTERM:
    that SIGTERM landed in torch's exit handlers and printed "Exception ignored in atexit callback" and a traceback."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", _SIGTERM_WHILE_EXITING], capture_output=True, text=True, env=env,
                            cwd=tmp_path, timeout=RUN_LIMIT_S, check=False)
    assert result.returncode == 0 and result.stdout.strip() == "exit handler finished", result.stderr
    assert "Exception ignored" not in result.stderr and "RankTerminated" not in result.stderr

"""Bounded multi-process runs: a stuck rank ends the run within the collective timeout, named, with nothing left behind.

How it works (used by every multi-card HPU strategy through `HPUParallelMixin` and its launchers):
- **The timeout.** Every collective (HCCL, or gloo on the emulated Gaudi) waits at most `collective_timeout()`:
  `HPUParallelStrategy(timeout=...)`, else `HPU_NB_COLLECTIVE_TIMEOUT` seconds, else 300 s. A rank waiting for a peer
  that never comes raises instead of hanging for torch's default 30 minutes.
- **Progress reports.** Each rank notes what it is doing (`RankProgress.track("training_step")`: a list push, no I/O)
  and a daemon thread writes that note to the job's c10d store every few seconds. When a collective fails, the rank
  that saw it reads every rank's note and raises `StuckRankError` naming the rank that did not answer and what it was
  doing ("in training_step for 301 s", "no report for 40 s: dead or frozen", or "died (killed by SIGKILL)": the
  process that started the ranks notes in the store how each one that failed ended).
- **A backstop.** Should a backend not honour its timeout, the reporting thread ends a rank that has waited in one
  collective for the timeout plus a minute, after printing the same diagnosis.
- **No leftovers**: `rank_processes.py` (the ranks' processes: watched, stopped, none left behind).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psutil
import torch.distributed as dist
from torch.distributed import TCPStore

from hpu_nb.core.strategy_parts.rank_processes import (  # noqa: F401  (PARENT_PID_ENV: re-exported, as before)
    EXIT_KEY_PREFIX,
    PARENT_PID_ENV,
    process_running,
)

TIMEOUT_ENV = "HPU_NB_COLLECTIVE_TIMEOUT"
MAX_COLLECTIVE_TIMEOUT_S = 365 * 24 * 3600.0
DEFAULT_COLLECTIVE_TIMEOUT = timedelta(minutes=5)
KEY_PREFIX = "hpu_nb/progress/"
COLLECTIVE_PHASES = frozenset({"backward", "barrier", "broadcast", "reduce", "all_gather", "process group"})
BACKSTOP_GRACE_S = 60.0  # a collective still waiting this long past the timeout: the backend ignored it; end the rank
EXIT_NOTE_WAIT_S = 2.0  # how long a rank explaining a failure waits for the note on how a vanished peer ended

_PEER_GONE = re.compile(r"connection (closed|reset)|(closed|reset) by peer|broken pipe", re.IGNORECASE)
_COMMUNICATION_FAILURE = re.compile(
    r"timed out|timeout|connection (closed|reset|refused)|broken pipe|socket|peer", re.IGNORECASE
)
# gloo's transport giving up on a peer: only a collective waits there, whichever phase it runs in (ZeRO-3 gathers the
# parameters inside training_step's forward, with no collective phase of ours around it)
_COLLECTIVE_TIMED_OUT = re.compile(r"timed out waiting \d+ ?ms for (send|recv) operation", re.IGNORECASE)


class StuckRankError(RuntimeError):
    """A rank did not answer a collective within the timeout (or died): the run was stopped."""


def collective_timeout(explicit: timedelta | None = None) -> timedelta:
    """The collective timeout: the strategy's `timeout`, else HPU_NB_COLLECTIVE_TIMEOUT (seconds), else 5 minutes."""
    if explicit is not None:
        if explicit.total_seconds() <= 0:
            raise ValueError(f"timeout={explicit!r} must be positive.")
        return explicit
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_COLLECTIVE_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"{TIMEOUT_ENV}={text!r} is not a number of seconds > 0 (e.g. {TIMEOUT_ENV}=300).")
    if seconds > MAX_COLLECTIVE_TIMEOUT_S:  # timedelta and torch's millisecond clocks overflow far above this
        raise ValueError(f"{TIMEOUT_ENV}={text!r} is more than a year ({MAX_COLLECTIVE_TIMEOUT_S:.0f} s): give a number"
                         f" of seconds up to that (e.g. {TIMEOUT_ENV}=300).")
    return timedelta(seconds=seconds)


def report_interval(timeout: timedelta) -> float:
    """Seconds between progress reports: often enough to tell a dead rank from a busy one well within the timeout."""
    return min(max(timeout.total_seconds() / 30.0, 0.5), 10.0)


def is_communication_failure(err: BaseException, phase: str | None) -> bool:
    """A collective or store operation that failed because a peer did not answer (timeout, closed connection).

    torch's distributed errors say so by type; gloo's plain RuntimeErrors by their text: its transport's time-out in
    any phase, other words (a closed connection, a socket) only inside a collective phase.
    """
    if isinstance(err, getattr(dist, "DistError", ())):
        return True
    if isinstance(err, RuntimeError) and _COLLECTIVE_TIMED_OUT.search(str(err)):
        return True
    return (phase in COLLECTIVE_PHASES and isinstance(err, RuntimeError)
            and bool(_COMMUNICATION_FAILURE.search(str(err))))


class RankProgress:
    """What this rank is doing, reported to the job's store by a daemon thread; reads every rank's report on failure."""

    def __init__(self, rank: int, world_size: int, timeout: timedelta, idle_phase: str = "between steps") -> None:
        """idle_phase: what a rank is doing when it is in no tracked phase (the Trainer: "between steps"; Fabric, whose
        loop is the user's: "the script's own code")."""
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self.idle_phase = idle_phase
        self.interval = report_interval(timeout)
        self._stack: list[tuple[str, int, float]] = []  # (phase, how many times entered, monotonic start)
        self._idle_since = time.monotonic()  # when the stack last became empty
        self._counts: dict[str, int] = {}
        self._store: TCPStore | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failed_in: dict[str, Any] | None = None

    # -- the main thread's side: cheap --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def track(self, phase: str) -> Iterator[None]:
        count = self._counts[phase] = self._counts.get(phase, 0) + 1
        self._stack.append((phase, count, time.monotonic()))
        try:
            yield
        except BaseException:
            if self.failed_in is None:  # the innermost phase an exception came from (the stack unwinds after)
                self.failed_in = self.snapshot()
            raise
        finally:
            self._stack.pop()
            if not self._stack:
                self._idle_since = time.monotonic()

    def snapshot(self) -> dict[str, Any]:
        stack = list(self._stack)
        now = time.monotonic()
        phase, count, since = stack[-1] if stack else (self.idle_phase, 0, self._idle_since)
        return {
            "rank": self.rank,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "phase": phase,
            "count": count,
            "within": [f"{p} #{c}" for p, c, _ in stack[:-1]],
            "in_phase_s": round(now - since, 1),
            "reported_at": time.time(),
        }

    # -- reporting ----------------------------------------------------------------------------------------------------
    def start(self, host: str, port: int) -> None:
        """Connect to the job's c10d store (a client of the one torch.distributed uses) and report from a thread."""
        try:
            self._store = TCPStore(
                host, port, is_master=False, timeout=timedelta(seconds=10), wait_for_workers=False
            )
        except Exception:
            self._store = None
            return
        self._publish()
        self._thread = threading.Thread(target=self._run, name=f"hpu_nb-progress-rank{self.rank}", daemon=True)
        self._thread.start()

    def _publish(self) -> bool:
        store = self._store  # None until start() connects (or when it could not)
        if store is None:
            return False
        try:
            store.set(f"{KEY_PREFIX}{self.rank}", json.dumps(self.snapshot()))
            return True
        except Exception:
            return False

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            overdue = self._overdue_collective()
            if overdue is not None:
                self._abort(overdue)
            if not self._publish():
                return

    def _overdue_collective(self) -> float | None:
        """Seconds this rank has been inside one collective, when that is past the timeout plus BACKSTOP_GRACE_S."""
        stack = list(self._stack)
        if not stack or stack[-1][0] not in COLLECTIVE_PHASES:
            return None
        waited = time.monotonic() - stack[-1][2]
        return waited if waited > self.timeout.total_seconds() + BACKSTOP_GRACE_S else None

    def _abort(self, waited: float) -> None:
        """The backend did not end a collective at its timeout: say who did not answer, and end this process."""
        cause = (
            f"the collective backend did not end the wait at its {self.timeout.total_seconds():.0f} s timeout"
            f" ({waited:.0f} s so far)"
        )
        print(f"hpu_nb: {self.describe(self.snapshot(), cause)}", file=sys.stderr, flush=True)
        os._exit(1)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 1)
        self._thread = None

    # -- diagnosis ----------------------------------------------------------------------------------------------------
    def reports(self) -> dict[int, dict[str, Any] | None]:
        out: dict[int, dict[str, Any] | None] = {}
        for rank in range(self.world_size):
            key = f"{KEY_PREFIX}{rank}"
            try:
                store = self._store
                out[rank] = json.loads(store.get(key)) if store is not None and store.check([key]) else None
            except Exception:
                out[rank] = None
        return out

    def explain(self, err: BaseException) -> StuckRankError | None:
        """A StuckRankError naming the rank(s) that did not answer, from every rank's last report; None when `err` is
        not a failed collective (this rank's own error stays as it is)."""
        mine = self.failed_in or self.snapshot()
        if not is_communication_failure(err, mine["phase"]):
            return None
        return StuckRankError(self.describe(mine, f"{type(err).__name__}: {_first_line(err)}"))

    def describe(self, mine: dict[str, Any], cause: str) -> str:
        """Which rank(s) did not answer and what they were doing, from every rank's last report."""
        reports = self.reports() if self._store is not None else {}
        others = {r: rep for r, rep in reports.items() if r != self.rank}
        stale_after = max(3 * self.interval, 10.0)
        now = time.time()
        culprits, waiting = [], []
        for rank in range(self.world_size):
            if rank == self.rank:
                continue
            rep = others.get(rank)
            ended = self._how_it_ended(rep, peer_gone=bool(_PEER_GONE.search(cause))) if rep is not None else None
            if rep is None:
                culprits.append(f"rank {rank} sent no progress report (it never started, or ended early)")
            elif ended is not None:
                culprits.append(
                    f"rank {rank} (pid {rep['pid']} on {rep['host']}) died ({ended}; its last report had it in"
                    f" {_where(rep)})"
                )
            elif now - rep["reported_at"] > stale_after:
                why = ("it is stopped (SIGSTOP: a debugger, Ctrl-Z or a frozen container)" if _is_stopped(rep)
                       else "it died or is frozen")
                culprits.append(
                    f"rank {rank} (pid {rep['pid']} on {rep['host']}) sent no report for"
                    f" {now - rep['reported_at']:.0f} s: {why}"
                )
            elif rep["phase"] not in COLLECTIVE_PHASES:
                culprits.append(
                    f"rank {rank} (pid {rep['pid']} on {rep['host']}) did not answer: it has been in {_where(rep)}"
                    f" for {rep['in_phase_s']:.0f} s"
                )
            else:
                waiting.append(f"rank {rank} in {_where(rep)}")
        timeout_s = self.timeout.total_seconds()
        if culprits:
            head = "; ".join(culprits) + "."
        elif reports:
            head = "no rank is clearly behind (all were waiting in collectives: " + ", ".join(waiting) + ")."
        else:
            head = "the other ranks' progress reports could not be read."
        also = f" Also waiting: {', '.join(waiting)}." if culprits and waiting else ""
        return (
            f"The multi-device run stopped: rank {self.rank} waited for the other ranks in {_where(mine)} and gave up"
            f" ({cause}). {head[0].upper()}{head[1:]}{also} Every rank's collectives wait at most {timeout_s:.0f} s:"
            f" set HPUParallelStrategy(timeout=timedelta(seconds=...)) or {TIMEOUT_ENV}=<seconds> if a step"
            " legitimately takes longer (a long checkpoint save on one rank)."
        )

    def _how_it_ended(self, report: dict[str, Any], peer_gone: bool = False) -> str | None:
        """"killed by SIGKILL" / "exited with code 1" when the rank's process has ended, else None.

        From the note the launching process leaves in the store; for a process of this host that is gone, that note is
        awaited a moment (the launcher sees the exit a little after the collective here failed) before saying only that
        the process is gone. `peer_gone`: the collective failed on a closed connection, which a dying process closes
        while it is still in the process table: it is given that moment to leave it.
        """
        key = f"{EXIT_KEY_PREFIX}{report['pid']}"
        note = self._store_note(key, wait=0.0)
        if note is not None or report["host"] != socket.gethostname():
            return note
        deadline = time.monotonic() + (EXIT_NOTE_WAIT_S if peer_gone else 0.0)
        while process_running(report["pid"]):
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)
        return self._store_note(key, wait=EXIT_NOTE_WAIT_S) or "its process is gone"

    def _store_note(self, key: str, wait: float) -> str | None:
        if self._store is None:
            return None
        try:
            if wait > 0:
                self._store.wait([key], timedelta(seconds=wait))
            elif not self._store.check([key]):
                return None
            return self._store.get(key).decode()
        except Exception:
            return None


def _is_stopped(report: dict[str, Any]) -> bool:
    """Whether the reporting rank's process, on this host, is stopped (SIGSTOP / SIGTSTP)."""
    if report["host"] != socket.gethostname():
        return False
    try:
        return psutil.Process(report["pid"]).status() == psutil.STATUS_STOPPED
    except psutil.Error:
        return False


def _where(report: dict[str, Any]) -> str:
    """"reduce (in training_step #3, optimizer_step #3)": the innermost phase, then what it runs inside."""
    phase = report["phase"]
    what = phase if phase in COLLECTIVE_PHASES or not report.get("count") else f"{phase} #{report['count']}"
    outer = list(reversed(report.get("within", [])))
    return f"{what} (in {', '.join(outer)})" if outer else what


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:300] if text else ""

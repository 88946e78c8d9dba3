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
- **No leftovers.** The process that started the others watches them (`WorkerWatch`): when one fails, the others are
  stopped at once (SIGTERM, SIGCONT for a stopped one, SIGKILL after a few seconds); it stops them too when the run
  fails or is interrupted; a SIGTERM reaches it even while its main thread is blocked inside a collective (a wakeup fd
  read by a thread); the other ranks turn SIGTERM into an exit; and every started rank dies with its parent (Linux
  `PR_SET_PDEATHSIG`). A script's rank 0 (Lightning's script launcher, for the Trainer and for Fabric, whose
  `fabric.launch()` returns before the training runs) keeps this for its whole life (`ScriptRanks`): at its exit the
  ranks it started are stopped, after a failure at once, else once they have finished (at most a timeout later).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import multiprocessing.process
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

from typing_extensions import Self

TIMEOUT_ENV = "HPU_NB_COLLECTIVE_TIMEOUT"
MAX_COLLECTIVE_TIMEOUT_S = 365 * 24 * 3600.0
DEFAULT_COLLECTIVE_TIMEOUT = timedelta(minutes=5)
PARENT_PID_ENV = "HPU_NB_LAUNCHER_PID"  # set for the ranks a launcher starts: they die with that process
KEY_PREFIX = "hpu_nb/progress/"
EXIT_KEY_PREFIX = "hpu_nb/exit/pid/"  # how a rank's process ended, noted by the process that started it
COLLECTIVE_PHASES = frozenset({"backward", "barrier", "broadcast", "reduce", "all_gather", "process group"})
KILL_GRACE_S = 5.0  # how long a rank gets to end after SIGTERM before SIGKILL
BACKSTOP_GRACE_S = 60.0  # a collective still waiting this long past the timeout: the backend ignored it; end the rank
EXIT_NOTE_WAIT_S = 2.0  # how long a rank explaining a failure waits for the note on how a vanished peer ended
WATCH_INTERVAL_S = 0.2  # how often the launching process looks at the ranks it started

_PEER_GONE = re.compile(r"connection (closed|reset)|(closed|reset) by peer|broken pipe", re.IGNORECASE)
_COMMUNICATION_FAILURE = re.compile(
    r"timed out|timeout|connection (closed|reset|refused)|broken pipe|socket|peer", re.IGNORECASE
)


class StuckRankError(RuntimeError):
    """A rank did not answer a collective within the timeout (or died): the run was stopped."""


class RankTerminated(SystemExit):
    """This rank was told to stop (SIGTERM): another rank failed or the run is being shut down."""


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

    torch's distributed errors say so by type; gloo's plain RuntimeErrors by their text, raised inside a collective.
    """
    import torch.distributed as dist

    if isinstance(err, getattr(dist, "DistError", ())):
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
        self._store: Any = None
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
        from torch.distributed import TCPStore

        try:
            self._store = TCPStore(
                host, port, is_master=False, timeout=timedelta(seconds=10), wait_for_workers=False
            )
        except Exception:  # noqa: BLE001  no store, no reports: a failure is still bounded, only less well explained
            self._store = None
            return
        self._publish()
        self._thread = threading.Thread(target=self._run, name=f"hpu_nb-progress-rank{self.rank}", daemon=True)
        self._thread.start()

    def _publish(self) -> bool:
        try:
            self._store.set(f"{KEY_PREFIX}{self.rank}", json.dumps(self.snapshot()))
            return True
        except Exception:  # noqa: BLE001  the store went away (its host ended): nothing more to report to
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
                known = self._store is not None and self._store.check([key])
                out[rank] = json.loads(self._store.get(key)) if known else None
            except Exception:  # noqa: BLE001
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
        except Exception:  # noqa: BLE001  not noted (in time), or the store is gone
            return None


def _is_stopped(report: dict[str, Any]) -> bool:
    """Whether the reporting rank's process, on this host, is stopped (SIGSTOP / SIGTSTP)."""
    import psutil

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


# -- process hygiene -------------------------------------------------------------------------------------------------
def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when `parent_pid` (our parent) ends: no orphaned rank, however it ends.

    Linux's PR_SET_PDEATHSIG, called through libc (no library wraps just this); elsewhere nothing is done.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent ended before the call above: end now, as it would have made us
        os._exit(1)


def skip_garbage_collection_at_exit() -> None:
    """Make this process's exit quick: no garbage collection in the interpreter's teardown (`gc.freeze()` at exit).

    With torch and Lightning loaded, that collection alone takes seconds (about 5 s on a loaded 2-core machine) and
    frees nothing the OS would not: a rank told to stop, or a rank 0 ending, would hold the run that long."""
    global _fast_exit_registered
    if not _fast_exit_registered:
        _fast_exit_registered = True
        atexit.register(gc.freeze)


_fast_exit_registered = False


def exit_on_sigterm() -> None:
    """In a rank a launcher started: SIGTERM ends the rank, quickly (Lightning's own handler would only note it)."""
    if threading.current_thread() is not threading.main_thread():
        return
    skip_garbage_collection_at_exit()

    def handler(signum: int, _frame: Any) -> None:
        raise RankTerminated(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def describe_exit(returncode: int) -> str:
    """A process's end in words, from a Popen-style return code (negative: the signal that killed it)."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


def process_running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie has ended: only its parent has still to collect its status)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def child_returncode(handle: Any) -> int | None:
    """The return code of a child process that has ended, without collecting it (its owner still will); None while it
    runs. `handle`: a multiprocessing Process or a subprocess Popen; when its owner has collected it, its own record."""
    try:
        result = os.waitid(os.P_PID, handle.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # collected already, by its owner: the owner's object has the code
        if isinstance(handle, multiprocessing.process.BaseProcess):
            return handle.exitcode
        return handle.returncode
    except OSError:
        return None
    if result is None:
        return None
    return result.si_status if result.si_code == os.CLD_EXITED else -result.si_status


def stop_processes(pids: list[int], grace: float = KILL_GRACE_S) -> None:
    """SIGTERM the processes (and SIGCONT: a stopped process acts on SIGTERM only once continued), SIGKILL those still
    running after `grace` seconds. Nothing is collected: each process's owner keeps its exit status."""
    import psutil

    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(pid))
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
            proc.resume()
    if _wait_ended(procs, grace):
        return
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    _wait_ended(procs, grace)


def _wait_ended(procs: list[Any], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(process_running(p.pid) for p in procs):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def note_exit(address: tuple[str, int] | None, pid: int, returncode: int) -> None:
    """Leave in the job's store how a rank's process ended, for the ranks that waited for it to say so."""
    if address is None:
        return
    from torch.distributed import TCPStore

    with contextlib.suppress(Exception):  # no store (it was in the process that ended): nobody is left to tell
        store = TCPStore(address[0], address[1], is_master=False, timeout=timedelta(seconds=2),
                         wait_for_workers=False)
        store.set(f"{EXIT_KEY_PREFIX}{pid}", describe_exit(returncode))


class WorkerWatch:
    """In the process that started the ranks: when one of them fails, note how it ended in the job's store and stop the
    others at once (torch's and Lightning's launchers wait 30 s, or SIGKILL every process, this one included, before a
    rank could say who did not answer). `on_failure` is then called (a script's rank 0: its own backstop)."""

    def __init__(self, workers: Callable[[], list[Any]], address: Callable[[], tuple[str, int] | None],
                 on_failure: Callable[[], None] | None = None) -> None:
        self._workers, self._address, self._on_failure = workers, address, on_failure
        self._seen: list[Any] = []  # every worker seen (`workers()` may forget one its owner has collected)
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self.failed: dict[int, int] = {}  # pid -> return code of the workers that failed

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._run, name="hpu_nb-worker-watch", daemon=True)
        self._thread.start()
        return self

    def running_pids(self) -> list[int]:
        return [w.pid for w in self._current() if child_returncode(w) is None]

    def _current(self) -> list[Any]:
        self._seen += [w for w in self._workers() if w.pid is not None and w not in self._seen]
        return list(self._seen)

    def _run(self) -> None:
        while not self._done.wait(WATCH_INTERVAL_S):
            codes = {w.pid: child_returncode(w) for w in self._current()}
            newly = {pid: code for pid, code in codes.items() if code not in (None, 0) and pid not in self.failed}
            if not newly:
                continue
            self.failed.update(newly)
            for pid, code in newly.items():
                note_exit(self._address(), pid, code)
            stop_processes([pid for pid, code in codes.items() if code is None])
            if self._on_failure is not None:
                self._on_failure()

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=KILL_GRACE_S * 2 + 1)


def new_child_processes(before: set[Any]) -> list[Any]:
    """The multiprocessing children this process started since `before` (a copy of the set taken then).

    multiprocessing keeps its live children in `multiprocessing.process._children` (as `active_children()` reads it,
    without collecting any here); torch's start_processes and Lightning's fork / spawn launchers start theirs there."""
    return [p for p in list(multiprocessing.process._children) if p not in before]  # type: ignore[attr-defined]


def multiprocessing_children() -> set[Any]:
    return set(multiprocessing.process._children)  # type: ignore[attr-defined]


class ScriptRanks:
    """The ranks a script's rank 0 started (Lightning's script launcher, for the Trainer and for Fabric), kept in check
    for the rest of rank 0's life: watched (`WorkerWatch`), stopped with rank 0 on SIGTERM (`TerminationGuard`), and
    at rank 0's exit stopped at once after a failure, else awaited (they finish the same script) for at most the
    collective timeout plus a grace before being stopped. Should a rank fail and rank 0 not end on its own within the
    collective timeout plus a grace (it waits in no collective), rank 0 is sent SIGTERM."""

    def __init__(self, procs: list[Any], address: Callable[[], tuple[str, int] | None], timeout: timedelta) -> None:
        self.procs = procs
        self._timeout = timeout
        self.guard = TerminationGuard(self.running_pids)
        self.watch = WorkerWatch(lambda: list(self.procs), address, on_failure=self._end_rank_zero_later)

    def start(self) -> Self:
        self.guard.__enter__()
        self.watch.start()
        atexit.register(self.at_exit)
        skip_garbage_collection_at_exit()
        return self

    def running_pids(self) -> list[int]:
        return [p.pid for p in self.procs if child_returncode(p) is None]

    def stop(self) -> None:
        """Stop the ranks now (the run failed or is interrupted)."""
        stop_processes(self.running_pids())

    def _end_rank_zero_later(self) -> None:
        def end() -> None:
            print(f"hpu_nb: rank 0 (pid {os.getpid()}) did not end {wait:.0f} s after a rank it started failed:"
                  " stopping it.", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGTERM)

        wait = self._timeout.total_seconds() + KILL_GRACE_S
        timer = threading.Timer(wait, end)
        timer.daemon = True
        timer.start()

    def at_exit(self) -> None:
        failed = getattr(sys, "last_value", None) is not None  # an exception ended the script
        if not failed:
            _wait_ended_pids(self.running_pids(), self._timeout.total_seconds() + KILL_GRACE_S)
        self.stop()
        self.watch.stop()
        self.guard.__exit__(None, None, None)


_script_ranks: ScriptRanks | None = None  # this process's, when it is a script's rank 0 that started others


def adopt_script_ranks(procs: list[Any], address: Callable[[], tuple[str, int] | None], timeout: timedelta) -> None:
    """Keep the ranks this process (a script's rank 0) just started in check for the rest of its life."""
    global _script_ranks
    if _script_ranks is not None and _script_ranks.procs is procs:
        return
    _script_ranks = ScriptRanks(procs, address, timeout).start()


def stop_script_ranks() -> None:
    """Stop the ranks this process started, if any are running (its run failed or was interrupted)."""
    if _script_ranks is not None:
        _script_ranks.stop()


def _wait_ended_pids(pids: list[int], timeout: float) -> None:
    import psutil

    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(pid))
    _wait_ended(procs, timeout)


class TerminationGuard:
    """In the process that started the other ranks: SIGTERM stops them and then this process, even mid-collective.

    A Python signal handler only runs when the main thread is back in Python, and a rank waiting inside a gloo/HCCL
    collective is not, until the collective times out. So the signal is also written to a wakeup fd that a thread
    reads at once: it stops the other ranks (which ends the collective the main thread waits in), and if the main
    thread has still not ended `grace` seconds later, ends the process.
    """

    def __init__(self, children: Callable[[], list[int]], grace: float = 30.0) -> None:
        self._children = children
        self._grace = grace
        self.signalled: int | None = None
        self._previous: Any = None
        self._previous_fd = -1
        self._pipe: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None
        self._done = threading.Event()

    def __enter__(self) -> Self:
        if threading.current_thread() is not threading.main_thread():
            return self
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        try:
            previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except ValueError:  # not possible here: the Python handler alone will do
            previous_fd = None
        if previous_fd != -1:  # unavailable, or owned by someone else (an event loop): leave it to them
            if previous_fd is not None:
                signal.set_wakeup_fd(previous_fd)
            os.close(read_fd)
            os.close(write_fd)
            return self
        self._pipe = (read_fd, write_fd)
        self._thread = threading.Thread(target=self._watch, name="hpu_nb-termination-guard", daemon=True)
        self._thread.start()
        return self

    def _on_sigterm(self, signum: int, _frame: Any) -> None:
        self.signalled = signum
        stop_processes(self._children())
        raise RankTerminated(128 + signum)

    def _watch(self) -> None:
        assert self._pipe is not None
        while True:
            try:
                data = os.read(self._pipe[0], 64)
            except OSError:
                return
            if not data or self._done.is_set():
                return
            signals = set(data)
            if signal.SIGTERM in signals or signal.SIGINT in signals:
                self.signalled = signal.SIGTERM if signal.SIGTERM in signals else signal.SIGINT
                stop_processes(self._children())
                if not self._done.wait(self._grace):
                    print(
                        f"hpu_nb: rank 0 (pid {os.getpid()}) still blocked {self._grace:.0f} s after a"
                        f" {signal.Signals(self.signalled).name}: ending it.",
                        file=sys.stderr,
                        flush=True,
                    )
                    os._exit(128 + self.signalled)
                return

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
        if self._pipe is not None:
            signal.set_wakeup_fd(-1)
            os.close(self._pipe[1])  # ends the watcher's read
            if self._thread is not None:
                self._thread.join(timeout=5)
            os.close(self._pipe[0])
            self._pipe = None

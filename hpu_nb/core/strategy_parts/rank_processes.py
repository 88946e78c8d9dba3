"""The processes of a multi-process run: every rank a launcher started is watched, stopped when the run fails or is
interrupted, and none is left behind, however the run ends.

- The process that started the others watches them (`WorkerWatch`): when one fails, it notes in the job's store how it
  ended (for the ranks that waited for it to say so: `liveness.py`) and stops the others at once: SIGTERM, SIGCONT for
  a stopped one, SIGKILL after a few seconds (torch's launcher waits 30 s; Lightning's script launcher SIGKILLs every
  process, rank 0 included, before a rank could say which one did not answer).
- It stops them too when the run fails or is interrupted; a SIGTERM reaches it even while its main thread is blocked
  inside a collective (`TerminationGuard`: a wakeup fd read by a thread); the other ranks turn SIGTERM into an exit;
  every started rank dies with its parent (Linux `PR_SET_PDEATHSIG`); and no rank spends seconds collecting garbage
  at its exit.
- A script's rank 0 (Lightning's script launcher, for the Trainer and for Fabric, whose `fabric.launch()` returns
  before the training runs) keeps this for its whole life (`ScriptRanks`): at its exit the ranks it started are
  stopped, after a failure at once, else once they have finished (at most a collective timeout later).
- While it joins the job's process group (`joining_process_group`) its main thread waits in C++ for every rank, where
  no Python signal handler runs: an interrupt there (Ctrl-C reaches every rank, and one still starting never joins)
  stops the other ranks and ends it at once with the one interrupt line, instead of the collective timeout later.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import multiprocessing.process
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psutil
from torch.distributed import TCPStore
from typing_extensions import Self

PARENT_PID_ENV = "HPU_NB_LAUNCHER_PID"  # set for the ranks a launcher starts: they die with that process
EXIT_KEY_PREFIX = "hpu_nb/exit/pid/"  # how a rank's process ended, noted by the process that started it
KILL_GRACE_S = 5.0  # how long a rank gets to end after SIGTERM before SIGKILL
WATCH_INTERVAL_S = 0.2  # how often the launching process looks at the ranks it started


class RankTerminated(SystemExit):
    """This rank was told to stop (SIGTERM): another rank failed or the run is being shut down."""


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when `parent_pid` (our parent) ends: no orphaned rank, however it ends.

    Linux's PR_SET_PDEATHSIG, called through libc (no library wraps just this); elsewhere nothing is done.
    """
    if not sys.platform.startswith("linux"):
        return
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
    """In a rank a launcher started: SIGTERM ends the rank, quickly (Lightning's own handler would only note it).

    A rank already exiting (its exit handlers run: an interrupt or a failure ended its script, and the process that
    started it now stops it) is left to finish: raising there only printed an "Exception ignored in atexit callback"
    traceback, and its launcher SIGKILLs it should it not end in time."""
    if threading.current_thread() is not threading.main_thread():
        return
    skip_garbage_collection_at_exit()
    exiting = threading.Event()
    atexit.register(exiting.set)  # run before every exit handler registered until now (they run last-in, first-out)

    def handler(signum: int, _frame: Any) -> None:
        if not exiting.is_set():
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
        returncode: int | None = handle.returncode  # a subprocess.Popen
        return returncode
    except OSError:
        return None
    if result is None:
        return None
    return result.si_status if result.si_code == os.CLD_EXITED else -result.si_status


def stop_processes(pids: list[int], grace: float = KILL_GRACE_S) -> None:
    """SIGTERM the processes (and SIGCONT: a stopped process acts on SIGTERM only once continued), SIGKILL those still
    running after `grace` seconds. Nothing is collected: each process's owner keeps its exit status."""
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
    # typeshed does not declare multiprocessing.process._children (private, but what active_children() reads)
    return [p for p in list(multiprocessing.process._children) if p not in before]  # type: ignore[attr-defined]


def multiprocessing_children() -> set[Any]:
    return set(multiprocessing.process._children)  # type: ignore[attr-defined]  # not in typeshed (see above)


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
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(pid))
    _wait_ended(procs, timeout)


_joining_line: str | None = None  # while this process joins its job's process group: its line for an interrupt


@contextlib.contextmanager
def joining_process_group(interrupted_line: str) -> Iterator[None]:
    """Around this process's joining of the job's process group (torch's `init_process_group`: rank 0 waits in its
    store for every rank to connect, then for their gloo / HCCL connections). That wait is in C++: a KeyboardInterrupt
    is raised only once it ends, and a rank interrupted before it joined never comes, so it would end only at the
    collective timeout (5 minutes). A script's rank 0 (`TerminationGuard`) that sees SIGINT or SIGTERM meanwhile stops
    the other ranks and ends this process at once, `interrupted_line` (for SIGINT) its last output: nothing was trained
    yet, and nothing the process holds needs its exit handlers."""
    global _joining_line
    previous, _joining_line = _joining_line, interrupted_line
    try:
        yield
    finally:
        _joining_line = previous


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
                if _joining_line is not None:  # the main thread still waits in C++ for ranks that will not come
                    self._end_now(_joining_line if self.signalled == signal.SIGINT else None)
                if not self._done.wait(self._grace):
                    print(
                        f"hpu_nb: rank 0 (pid {os.getpid()}) still blocked {self._grace:.0f} s after a"
                        f" {signal.Signals(self.signalled).name}: ending it.",
                        file=sys.stderr,
                        flush=True,
                    )
                    os._exit(128 + self.signalled)
                return

    def _end_now(self, line: str | None) -> None:
        """End this process from the watcher thread (its main thread cannot act): `line` last, then the status a
        shell gives a process ended by the signal (130 for SIGINT)."""
        assert self.signalled is not None
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            if line is not None:
                print(line, file=sys.stderr, flush=True)
        os._exit(128 + self.signalled)

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

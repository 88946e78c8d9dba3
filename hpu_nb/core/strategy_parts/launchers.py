"""Launching the ranks of a multi-card HPU strategy, for the Trainer's launchers and Fabric's alike.

- the choice: Lightning's script launcher (`popen`) from a script or under torchrun / SLURM, a fork launcher in a
  notebook (the only kind Lightning accepts there), spawn on request (`resolve_start_method`);
- the Gaudi fork check (`ForkCheckMixin`): no fork of a process that opened the Gaudi runtime;
- liveness (`liveness.py`, `rank_processes.py`): launchers that leave no process behind however the run ends, and name
  a rank that stops answering: `WorkerLivenessMixin` for Lightning's fork / spawn launchers, `ScriptLivenessMixin`
  for its script launchers, put first in the bases of the Trainer's (hpu_nb.core.strategies.launchers) and Fabric's
  (hpu_nb.core.fabric.strategies) launcher classes;
- notebook output (`worker_output.py`): each forked worker sends its prints and progress-bar frames to the kernel in
  the order it wrote them, and the kernel publishes what they sent before the launch returns (issue 20).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import torch
from lightning.fabric.utilities.distributed import _set_num_threads_if_needed
from lightning.pytorch.trainer.connectors import accelerator_connector
from typing_extensions import override

from hpu_nb.core.strategy_parts import rank_processes
from hpu_nb.core.strategy_parts.interrupts import FitInterrupted, LaunchInterrupt, stopped_message
from hpu_nb.core.strategy_parts.worker_output import keep_worker_output_in_order, wait_for_worker_output
from hpu_nb.runtime import distributed as hpu_dist

if TYPE_CHECKING:
    from hpu_nb.core.strategy_parts.hosts import LauncherHost
else:
    LauncherHost = object  # a base for the type checker only (hosts.py)

__all__ = [
    "START_METHODS", "ForkCheckMixin", "ProcessStartMethod", "ScriptLivenessMixin", "StartMethod",
    "WorkerLivenessMixin", "explaining", "in_interactive_session", "one_cpu_thread_after_fork", "resolve_start_method",
]

StartMethod = Literal["popen", "fork", "spawn", "forkserver"]
ProcessStartMethod = Literal["fork", "spawn", "forkserver"]  # what Lightning's fork / spawn launchers take
START_METHODS: tuple[StartMethod, ...] = ("popen", "fork", "spawn", "forkserver")


def in_interactive_session() -> bool:
    """What Lightning's connector believes (it only accepts fork launchers when this is True)."""
    return bool(accelerator_connector._IS_INTERACTIVE)


def resolve_start_method(start_method: str | None) -> StartMethod:
    """None / "auto": fork in a notebook (Lightning requires it there), Lightning's script launcher elsewhere."""
    if start_method in (None, "auto"):
        forkable = "fork" in torch.multiprocessing.get_all_start_methods()
        return "fork" if in_interactive_session() and forkable else "popen"
    for method in START_METHODS:
        if start_method == method:
            return method
    raise ValueError(f"start_method={start_method!r} is not one of: auto, {', '.join(START_METHODS)}.")


class ForkCheckMixin(LauncherHost):
    """For a fork / spawn launcher (Trainer's or Fabric's): refuse to fork a Gaudi runtime this process has opened."""

    _start_method: ProcessStartMethod

    @override
    def launch(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._start_method in ("fork", "forkserver"):
            hpu_dist.check_fork_allowed()
        return super().launch(function, *args, **kwargs)


class WorkerLivenessMixin(ForkCheckMixin):
    """For Lightning's fork / spawn launcher, the Trainer's and Fabric's (put first in the bases): the Gaudi fork
    check, and liveness: the workers are watched (one that fails is noted in the store, the others stopped at once, a
    stopped one too), none outlives the launch (interrupted, failed, or the parent killed), a stuck rank is named;
    and their notebook output stays in order (`worker_output.py`).

    Each launcher's `_wrapping_function` (their signatures differ) passes its function through `_worker_function`.
    """

    _strategy: Any

    @override
    def launch(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self._parent_pid = os.getpid()
        rank_processes.skip_garbage_collection_at_exit()  # a script that launched workers ends promptly too
        before = rank_processes.multiprocessing_children()
        watch = rank_processes.WorkerWatch(lambda: rank_processes.new_child_processes(before), self._store_address)
        watch.start()
        # the Trainer's workers stop together at a step boundary on an interrupt (interrupts.py); Fabric's loop is
        # the user's: its workers are ended at once
        trainer = "trainer" in kwargs
        interrupt = LaunchInterrupt(watch.running_pids, watch.stop, graceful=trainer)
        self._worker_steps: tuple[int, bool] | None = None  # rank 0's steps, and whether an interrupt ended them
        try:
            with interrupt:
                result = super().launch(function, *args, **kwargs)
        except BaseException as err:
            # an interrupt, SIGTERM turned into an exception, or a failed worker (torch stops the others then, the
            # watch already did): no worker may outlive this call.
            rank_processes.stop_processes(watch.running_pids())
            if interrupt.requested:
                raise FitInterrupted(stopped_message(None, trainer)) from err
            raise
        finally:
            watch.stop()
            wait_for_worker_output()  # the workers ended: their last output (the bar's last frame) comes first
        if interrupt.requested:
            raise FitInterrupted(stopped_message(self._worker_steps))
        return result

    def _store_address(self) -> tuple[str, int] | None:
        env = self._strategy.cluster_environment
        return None if env is None else (env.main_address, env.main_port)

    def _worker_function(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """In a worker, before it runs `function`: it dies with the launching process and ends on SIGTERM; its
        communication failures name the rank that did not answer; forked from a notebook's kernel, its output (the
        progress bar's frames) reaches the kernel in the order it was written."""
        keep_worker_output_in_order()
        rank_processes.die_with_parent(self._parent_pid)
        rank_processes.exit_on_sigterm()
        if self._start_method in ("fork", "forkserver"):
            one_cpu_thread_after_fork()
        return explaining(self._strategy, function)


def one_cpu_thread_after_fork() -> None:
    """A forked worker computes on one CPU thread, as torch's DataLoader workers do. torch's OpenMP (GNU libgomp) keeps
    the thread pool the launching process started: a forked child inherits the pool's bookkeeping but not its threads,
    and its first parallel region waits for them forever (measured: a 1-card DeepSpeed ZeRO-3 fit forked from a
    notebook kernel that had multiplied a 2048x64 matrix hung in the first bfloat16 cast). Lightning then keeps the
    count (it sets threads only where OMP_NUM_THREADS is unset). For all of a machine's cores, run the script launcher
    (start_method="popen", or a script)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


class ScriptLivenessMixin(LauncherHost):
    """For Lightning's script launcher, the Trainer's and Fabric's (put first in the bases; rank 0 runs the script
    again for the other ranks): they die with rank 0 and end on SIGTERM; rank 0 keeps them in check for the rest of
    its life (`rank_processes.ScriptRanks`: watched, stopped on its SIGTERM even inside a collective, stopped when it
    fails, awaited at its exit) — for the rest of its life because Fabric's `fabric.launch()` returns before the
    training runs; and a stuck rank is named.

    `launch` is Lightning's (validate, start the other ranks, set the thread count, run), with hpu_nb's watch in place
    of Lightning's child-process observer, which SIGKILLs every process, rank 0 included, before it can say which rank
    did not answer (tests/core/test_parallel_liveness.py checks Lightning's launch is still the one this replaces).
    """

    cluster_environment: Any
    num_processes: int
    num_nodes: int
    procs: list[Any]

    def __init__(self, strategy: Any, cluster_environment: Any, num_processes: int, num_nodes: int) -> None:
        super().__init__(cluster_environment, num_processes, num_nodes)
        self._strategy = strategy

    @override
    def launch(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        env = self.cluster_environment
        parent = os.environ.get(rank_processes.PARENT_PID_ENV)
        if env.creates_processes_externally and parent is not None and parent == str(os.getppid()):
            rank_processes.die_with_parent(int(parent))  # a rank that our rank 0 started
            rank_processes.exit_on_sigterm()
        function = explaining(self._strategy, function)
        kwargs.pop("trainer", None)  # the Trainer's launcher is given it; running the function does not need it
        env.validate_settings(num_devices=self.num_processes, num_nodes=self.num_nodes)
        if not env.creates_processes_externally:
            self._call_children_scripts()
            address = (env.main_address, env.main_port)
            rank_processes.adopt_script_ranks(self.procs, lambda: address, self._strategy._timeout)
        _set_num_threads_if_needed(num_processes=self.num_processes)
        try:
            return function(*args, **kwargs)
        except BaseException:
            rank_processes.stop_script_ranks()  # rank 0 failed or was interrupted: its ranks go with it, now
            raise

    @override
    def _call_children_scripts(self) -> None:
        os.environ[rank_processes.PARENT_PID_ENV] = str(os.getpid())
        try:
            super()._call_children_scripts()
        finally:
            os.environ.pop(rank_processes.PARENT_PID_ENV, None)


def explaining(strategy: Any, function: Callable[..., Any]) -> Callable[..., Any]:
    """`function`, whose communication failures become a StuckRankError naming the rank that did not answer."""

    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except Exception as err:
            explained = strategy.explain_failure(err)
            if explained is None:
                raise
            raise explained from err

    return run

"""HPUParallelStrategy / HPUDDPStrategy: one process per Gaudi card, DDP over HCCL.

`HPUParallelMixin` holds what every multi-card HPU strategy (DDP, DeepSpeed, FSDP; for the Trainer and for Fabric)
adds to its Lightning base:
- the process group: HCCL prepared by the runtime (`initialize_distributed_hpu`) before `init_process_group`;
- HCCL's reduce semantics (sum / min / max, mean = sum / world size), used everywhere so scripts behave alike on
  the emulated Gaudi and on a Gaudi;
- launching: Lightning's script launcher (`popen`) from a script or under torchrun / SLURM, and a fork launcher in
  a notebook (the only kind Lightning accepts there); each worker drives its own card (hpu:0 of its process);
- devices: every process's card is `hpu:0`, so `parallel_devices=[torch.device("hpu")] * n` gives each rank the
  root device hpu:0;
- liveness (`liveness.py`, `rank_processes.py`): a bounded collective timeout (5 minutes unless set), progress reports
  that name a rank that stops answering, and launchers that leave no process behind however the run ends:
  `WorkerLivenessMixin` and `ScriptLivenessMixin`, one implementation for Lightning's fork / spawn and script launchers
  of the Trainer and of Fabric;
- notebook output (`worker_output.py`): each forked worker sends its prints and progress-bar frames to the kernel in
  the order it wrote them, and the kernel publishes what they sent before the launch returns (issue 20).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

import torch
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.utilities.distributed import _distributed_is_initialized, _set_num_threads_if_needed
from lightning.pytorch.strategies.ddp import DDPStrategy
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning.pytorch.trainer.connectors import accelerator_connector
from torch import Tensor
from torch.distributed import ReduceOp
from typing_extensions import override

from hpu_nb.core import noise
from hpu_nb.core.strategies import interrupts, liveness, rank_processes
from hpu_nb.core.strategies.hpu_steps import HPUStepsMixin
from hpu_nb.core.strategies.worker_output import keep_worker_output_in_order, wait_for_worker_output
from hpu_nb.runtime import distributed as hpu_dist
from hpu_nb.runtime import get_backend

if TYPE_CHECKING:
    from hpu_nb.core.strategies.hosts import LauncherHost, ParallelStrategyHost
else:  # bases for the type checker only (hosts.py)
    LauncherHost = ParallelStrategyHost = object

__all__ = [
    "ForkCheckMixin", "HPUDDPStrategy", "HPUParallelMixin", "HPUParallelStrategy", "ScriptLivenessMixin",
    "WorkerLivenessMixin", "hccl_reduce",
]

StartMethod = Literal["popen", "fork", "spawn", "forkserver"]
ProcessStartMethod = Literal["fork", "spawn", "forkserver"]  # what Lightning's fork / spawn launchers take
START_METHODS: tuple[StartMethod, ...] = ("popen", "fork", "spawn", "forkserver")
REDUCE_OPS = ("sum", "product", "min", "max", "mean")  # HCCL's (the bridge's hccl_kernels.cpp), mean = sum / size


# -- HCCL reduce semantics ------------------------------------------------------------------------------------------
def reduce_op_name(reduce_op: Any) -> str:
    """'sum' | 'product' | 'min' | 'max' | 'mean' for a string or ReduceOp; a TypeError (as lightning-habana raised)
    for what HCCL cannot do."""
    if reduce_op is None:
        return "mean"
    if isinstance(reduce_op, str):
        name = reduce_op.strip().lower()
        name = {"avg": "mean", "prod": "product"}.get(name, name)
        if name in REDUCE_OPS:
            return name
    else:
        for name, op in (("sum", ReduceOp.SUM), ("product", ReduceOp.PRODUCT), ("min", ReduceOp.MIN),
                         ("max", ReduceOp.MAX), ("mean", ReduceOp.AVG)):
            try:
                if reduce_op == op:
                    return name
            except TypeError:
                break
    raise TypeError(
        f"reduce_op={reduce_op!r} is not supported on HPU: HCCL reduces with 'sum', 'product', 'min' or 'max', and"
        " 'mean' (= sum / world size)."
    )


def hccl_reduce(tensor: Tensor, group: Any = None, reduce_op: Any = "mean") -> Tensor:
    """All-reduce `tensor` across the group the way HCCL does; integer tensors are cast to float for a mean.

    sum / product / min / max reduce in place, like Lightning's DDP reduce. Without a process group the tensor comes
    back as is.
    """
    name = reduce_op_name(reduce_op)
    if not isinstance(tensor, Tensor) or not _distributed_is_initialized():
        return tensor
    group = torch.distributed.group.WORLD if group is None else group
    if name != "mean":
        torch.distributed.all_reduce(tensor, op=getattr(ReduceOp, name.upper()), group=group)
        return tensor
    if not torch.is_floating_point(tensor):
        tensor = tensor.float()
    torch.distributed.all_reduce(tensor, op=ReduceOp.SUM, group=group)
    return tensor.div_(torch.distributed.get_world_size(group))


# -- launching ------------------------------------------------------------------------------------------------------
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
        interrupt = interrupts.LaunchInterrupt(watch.running_pids, watch.stop, graceful=trainer)
        self._worker_steps: tuple[int, bool] | None = None  # rank 0's steps, and whether an interrupt ended them
        try:
            with interrupt:
                result = super().launch(function, *args, **kwargs)
        except BaseException as err:
            # an interrupt, SIGTERM turned into an exception, or a failed worker (torch stops the others then, the
            # watch already did): no worker may outlive this call.
            rank_processes.stop_processes(watch.running_pids())
            if interrupt.requested:
                raise interrupts.FitInterrupted(interrupts.stopped_message(None, trainer)) from err
            raise
        finally:
            watch.stop()
            wait_for_worker_output()  # the workers ended: their last output (the bar's last frame) comes first
        if interrupt.requested:
            raise interrupts.FitInterrupted(interrupts.stopped_message(self._worker_steps))
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
        return _explaining(self._strategy, function)


def one_cpu_thread_after_fork() -> None:
    """A forked worker computes on one CPU thread, as torch's DataLoader workers do. torch's OpenMP (GNU libgomp) keeps
    the thread pool the launching process started: a forked child inherits the pool's bookkeeping but not its threads,
    and its first parallel region waits for them forever (measured: a 1-card DeepSpeed ZeRO-3 fit forked from a
    notebook kernel that had multiplied a 2048x64 matrix hung in the first bfloat16 cast). Lightning then keeps the
    count (it sets threads only where OMP_NUM_THREADS is unset). For all of a machine's cores, run the script launcher
    (start_method="popen", or a script)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


class HPUMultiProcessingLauncher(WorkerLivenessMixin, _MultiProcessingLauncher):
    """Lightning's fork/spawn launcher for the Trainer, with hpu_nb's fork check and liveness (WorkerLivenessMixin)."""

    @override
    def launch(self, function: Callable[..., Any], *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        self.procs = []  # this launch's workers only: never signal a pid left from an earlier launch
        with _callbacks_following_workers(trainer):
            return super().launch(function, *args, trainer=trainer, **kwargs)

    @override
    def _wrapping_function(
        self, process_idx: int, trainer: Any, function: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> None:
        function = self._worker_function(function)
        if trainer is not None:  # an interrupt stops every rank before the same batch (interrupts.py)
            self._stop = interrupts.StopAtStepBoundary(self._store_address()).install(trainer)
            function = self._stop.wrap(function, trainer)
        return super()._wrapping_function(process_idx, trainer, function, *args, **kwargs)

    @override
    def get_extra_results(self, trainer: Any) -> dict[str, Any]:
        """In rank 0, after its fit: also the steps it ran and whether an interrupt stopped it there."""
        extra = super().get_extra_results(trainer)
        stop = getattr(self, "_stop", None)
        extra[interrupts.WORKER_STEPS] = (int(trainer.global_step), stop is not None and stop.stopped)
        return extra

    @override
    def update_main_process_results(self, trainer: Any, extra: dict[str, Any]) -> None:
        self._worker_steps = extra.pop(interrupts.WORKER_STEPS, None)
        super().update_main_process_results(trainer, extra)

    @override
    def _recover_results_in_main_process(self, worker_output: Any, trainer: Any) -> None:
        """The launching process keeps no card: the worker's weights are loaded onto the CPU, where its model lives
        (loading them onto the HPU would acquire a card here, and a later fork would be refused)."""
        io = self._strategy.checkpoint_io
        io.load_checkpoint = functools.partial(io.load_checkpoint, map_location="cpu")
        try:
            super()._recover_results_in_main_process(worker_output, trainer)
        finally:
            del io.load_checkpoint


@contextlib.contextmanager
def _callbacks_following_workers(trainer: Any) -> Iterator[None]:
    """Around a launch, the Trainer's callbacks that follow the workers from this process (a notebook's kernel), e.g.
    MemoryMonitor.workers_launched: no callback hook runs in the launching process otherwise."""
    with contextlib.ExitStack() as stack:
        for callback in getattr(trainer, "callbacks", None) or []:
            if callable(getattr(type(callback), "workers_launched", None)):
                stack.enter_context(callback.workers_launched(trainer))
        yield


class ScriptLivenessMixin(LauncherHost):
    """For Lightning's script launcher, the Trainer's and Fabric's (put first in the bases; rank 0 runs the script
    again for the other ranks): they die with rank 0 and end on SIGTERM; rank 0 keeps them in check for the rest of
    its life (`rank_processes.ScriptRanks`: watched, stopped on its SIGTERM even inside a collective, stopped when it
    fails, awaited at its exit) — for the rest of its life because Fabric's `fabric.launch()` returns before the
    training runs; and a stuck rank is named.

    `launch` is Lightning's (validate, start the other ranks, set the thread count, run), with hpu_nb's watch in place
    of Lightning's child-process observer, which SIGKILLs every process, rank 0 included, before it can say which rank
    did not answer (tests/test_parallel_liveness.py checks Lightning's launch is still the one this replaces).
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
        function = _explaining(self._strategy, function)
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


class HPUSubprocessScriptLauncher(ScriptLivenessMixin, _SubprocessScriptLauncher):
    """Lightning's script launcher for the Trainer, with hpu_nb's liveness (ScriptLivenessMixin)."""


def _explaining(strategy: Any, function: Callable[..., Any]) -> Callable[..., Any]:
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


class HPUParallelMixin(ParallelStrategyHost):
    """Put first in the bases of a multi-card HPU strategy: `class S(HPUParallelMixin, HPUStepsMixin, DDPStrategy)`."""

    _hpu_start_method: str | None = None  # as given ("auto" too); Lightning's own `_start_method` is left alone
    _progress: liveness.RankProgress | None = None
    _idle_phase = "between steps"  # what a rank outside every tracked phase is doing (Fabric: the user's own loop)

    # -- the collective timeout -----------------------------------------------------------------------------------
    @property
    def _collective_timeout(self) -> timedelta:
        """What every collective waits at most: the strategy's `timeout`, else HPU_NB_COLLECTIVE_TIMEOUT, else 5 min."""
        return liveness.collective_timeout(self.__dict__.get("_hpu_timeout"))

    @property
    def _timeout(self) -> timedelta | None:
        """Lightning's attribute, read by its process-group set-up: `_collective_timeout` (never None; typed as
        Lightning types the attribute)."""
        return self._collective_timeout

    @_timeout.setter
    def _timeout(self, value: timedelta | None) -> None:
        # Lightning's strategies store their `timeout` argument here; its default (torch's 30 minutes) means "not set".
        self._hpu_timeout = None if value is default_pg_timeout else value

    # -- progress reports, for naming a stuck rank ------------------------------------------------------------------
    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        self._start_progress_reports()

    def _start_progress_reports(self) -> None:
        """Once the process group exists: report this rank's progress to the job's store (strategies whose
        `setup_environment` skips this mixin's, as DeepSpeed's, call it themselves)."""
        if self._progress is None and _distributed_is_initialized() and self.world_size > 1:
            self._progress = liveness.RankProgress(
                self.global_rank, self.world_size, self._collective_timeout, idle_phase=self._idle_phase
            )
            env = self.cluster_environment
            assert env is not None  # a process group exists: Lightning set it up from this environment
            self._progress.start(env.main_address, env.main_port)

    @contextlib.contextmanager
    def _tracked(self, phase: str) -> Iterator[None]:
        """Note the phase for the progress reports; a collective that fails there becomes a StuckRankError naming the
        rank that did not answer (here, where it happens: Fabric's training loop is the user's, run outside any
        launcher's reach)."""
        if self._progress is None:
            yield
            return
        with self._progress.track(phase):
            try:
                yield
            except Exception as err:
                explained = self.explain_failure(err)
                if explained is None:
                    raise
                raise explained from err

    def explain_failure(self, err: BaseException) -> liveness.StuckRankError | None:
        """A StuckRankError naming the rank that did not answer, when `err` is a failed collective; else None."""
        if self._progress is None or isinstance(err, liveness.StuckRankError):
            return None
        return self._progress.explain(err)

    @override
    def teardown(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        super().teardown()

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        with self._tracked("training_step"), self._ddp_time_stats_quiet():
            return super().training_step(*args, **kwargs)

    @override
    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        with self._tracked("validation_step"):
            return super().validation_step(*args, **kwargs)

    @override
    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        with self._tracked("test_step"):
            return super().test_step(*args, **kwargs)

    @override
    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        with self._tracked("predict_step"):
            return super().predict_step(*args, **kwargs)

    @override
    def backward(self, *args: Any, **kwargs: Any) -> Any:
        with self._tracked("backward"):  # DDP all-reduces the gradients during backward
            return super().backward(*args, **kwargs)

    @override
    def optimizer_step(self, *args: Any, **kwargs: Any) -> Any:
        with self._tracked("optimizer_step"):  # the closure runs training_step and backward inside it
            return super().optimizer_step(*args, **kwargs)

    @override
    def barrier(self, *args: Any, **kwargs: Any) -> None:
        with self._tracked("barrier"), noise.quiet_barrier():
            return super().barrier(*args, **kwargs)

    @override
    def broadcast(self, *args: Any, **kwargs: Any) -> Any:
        with self._tracked("broadcast"):
            return super().broadcast(*args, **kwargs)

    @override
    def all_gather(self, *args: Any, **kwargs: Any) -> Any:
        with self._tracked("all_gather"):
            return super().all_gather(*args, **kwargs)

    _ddp_time_stats_quiet = noise.OnceNativeMessage(noise.DDP_TIME_STATS)  # each worker process: its own copy

    def __init__(self, *args: Any, start_method: str | None = "auto", **kwargs: Any) -> None:
        """start_method: "auto" (fork in a notebook, Lightning's script launcher elsewhere), "popen", "fork", "spawn"
        or "forkserver"; checked now, resolved when the launcher is configured."""
        resolve_start_method(start_method)
        super().__init__(*args, **kwargs)
        self._hpu_start_method = start_method

    # -- devices --------------------------------------------------------------------------------------------------
    @property
    @override
    def root_device(self) -> torch.device:
        """This process's card: hpu:0 (an `hpu` device without an index is completed, as torch's FSDP needs one)."""
        assert self.parallel_devices is not None, "the strategy has no devices yet (it gets them from the Trainer)"
        if not 0 <= self.local_rank < len(self.parallel_devices):  # e.g. Ray's environment with fewer `devices`
            raise RuntimeError(
                f"{type(self).__name__} has {len(self.parallel_devices)} device(s) per node"
                f" ({', '.join(str(d) for d in self.parallel_devices)}), and local rank {self.local_rank} asked for"
                " its own: give it one device per process on the node (Trainer(devices=N) with N the processes"
                " per node; under Ray's RayLightningEnvironment, N the workers per node)."
            )
        device = self.parallel_devices[self.local_rank]
        return get_backend().root_device() if device.type == "hpu" else device

    @override
    def determine_ddp_device_ids(self) -> list[int] | None:
        return None  # one card per process: DDP uses the module's device

    @override
    def _determine_ddp_device_ids(self) -> list[int] | None:  # Fabric's name for the same question
        return None

    # -- process group --------------------------------------------------------------------------------------------
    @property
    @override
    def process_group_backend(self) -> str:
        """"hccl" unless one was given (on the emulated Gaudi, HCCL's semantics over gloo)."""
        return self._process_group_backend or hpu_dist.process_group_backend()

    @override
    def _get_process_group_backend(self) -> str:
        """Called by Lightning (Trainer and Fabric, DDP and FSDP) right before `init_process_group`: prepare HCCL."""
        return self._prepare_hpu_distributed()

    def _prepare_hpu_distributed(self) -> str:
        """HCCL set-up on a Gaudi (import, initialize_distributed_hpu); returns the process-group backend."""
        backend = hpu_dist.initialize_distributed(
            world_size=self.world_size,
            rank=self.global_rank,
            local_rank=self.local_rank,
            local_world_size=self.num_processes,
        )
        self._process_group_backend = self._process_group_backend or backend
        return self._process_group_backend

    # -- collectives ----------------------------------------------------------------------------------------------
    @override
    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        """HCCL semantics: sum / min / max natively, mean as sum / world size (ints become float).

        HCCL reduces device tensors only: a host tensor (e.g. a logged value) is moved to this card first, as
        lightning-habana did; the result stays on the card.
        """
        if isinstance(tensor, Tensor):
            if tensor.device != self.root_device:
                tensor = tensor.to(self.root_device)
            with self._tracked("reduce"):
                return hccl_reduce(tensor, group, reduce_op)
        return tensor

    @override
    def all_reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:  # Fabric's name
        return HPUParallelMixin.reduce(self, tensor, group, reduce_op)

    # -- launching ------------------------------------------------------------------------------------------------
    @override
    def _configure_launcher(self) -> None:
        """Lightning's script launcher (its own process per card), or fork / spawn (a notebook: fork)."""
        assert self.cluster_environment is not None
        method = resolve_start_method(self._hpu_start_method)
        if not self.cluster_environment.creates_processes_externally:
            # This process launches the workers: a MASTER_PORT that only Habana's HCCL import set (12345) is dropped,
            # so Lightning picks a free port and jobs sharing the machine do not meet on the same one.
            hpu_dist.release_habana_default_port()
        if method == "popen" or self.cluster_environment.creates_processes_externally:
            self._launcher = self._script_launcher()
        else:
            self._launcher = self._process_launcher(method)

    def _script_launcher(self) -> Any:
        """The launcher that runs the script again per card: the Trainer's (Fabric strategies return Fabric's)."""
        return HPUSubprocessScriptLauncher(self, self.cluster_environment, self.num_processes, self.num_nodes)

    def _process_launcher(self, start_method: ProcessStartMethod) -> Any:
        """The fork / spawn launcher: the Trainer's (Fabric strategies return Fabric's)."""
        return HPUMultiProcessingLauncher(self, start_method=start_method)


class HPUParallelStrategy(HPUParallelMixin, HPUStepsMixin, DDPStrategy):
    """DDP across Gaudi cards over HCCL (gloo on the emulated Gaudi), chosen for
    `Trainer(accelerator="hpu", devices>1)`.

    start_method: "auto" (fork in a notebook, Lightning's script launcher elsewhere), "popen", "fork" or "spawn".
    timeout: how long any collective waits for the other ranks before the run stops with a StuckRankError naming the
    rank that did not answer; default HPU_NB_COLLECTIVE_TIMEOUT seconds, else 5 minutes.
    """

    strategy_name = "hpu_parallel"

    def __init__(
        self,
        accelerator: Any = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: Any = None,
        checkpoint_io: Any = None,
        precision_plugin: Any = None,
        ddp_comm_state: object | None = None,
        ddp_comm_hook: Callable[..., Any] | None = None,
        ddp_comm_wrapper: Callable[..., Any] | None = None,
        model_averaging_period: int | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = None,
        start_method: str | None = "auto",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
            ddp_comm_state=ddp_comm_state,
            ddp_comm_hook=ddp_comm_hook,
            ddp_comm_wrapper=ddp_comm_wrapper,
            model_averaging_period=model_averaging_period,
            process_group_backend=process_group_backend,
            timeout=timeout,
            start_method=start_method,
            **kwargs,
        )

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(cls.strategy_name, cls, description=(cls.__doc__ or cls.__name__).splitlines()[0],
                                 override=True)


class HPUDDPStrategy(HPUParallelStrategy):
    """The same strategy under the name DDP users look for: `Trainer(accelerator="hpu", strategy="hpu_ddp")`."""

    strategy_name = "hpu_ddp"

"""`HPUParallelMixin`: what every multi-card HPU strategy (DDP, DeepSpeed, FSDP; for the Trainer and for Fabric) adds to
its Lightning base:
- the process group: HCCL prepared by the runtime (`initialize_distributed_hpu`) before `init_process_group`;
- HCCL's reduce semantics (collectives.py), used everywhere so scripts behave alike on the emulated Gaudi and on a
  Gaudi;
- the launcher choice (launchers.py): Lightning's script launcher from a script or under torchrun / SLURM, fork in a
  notebook; each worker drives its own card (hpu:0 of its process);
- devices: every process's card is `hpu:0`, so `parallel_devices=[torch.device("hpu")] * n` gives each rank the
  root device hpu:0;
- liveness (liveness.py): a bounded collective timeout (5 minutes unless set), and progress reports that name a rank
  that stops answering.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.utilities.distributed import _distributed_is_initialized
from torch import Tensor
from typing_extensions import override

from hpu_nb.core import noise
from hpu_nb.core.strategy_parts import liveness, rank_processes
from hpu_nb.core.strategy_parts.collectives import hccl_reduce
from hpu_nb.core.strategy_parts.interrupts import stopped_message
from hpu_nb.core.strategy_parts.launchers import ProcessStartMethod, resolve_start_method
from hpu_nb.runtime import distributed as hpu_dist
from hpu_nb.runtime import get_backend

if TYPE_CHECKING:
    from hpu_nb.core.strategy_parts.hosts import ParallelStrategyHost
else:
    ParallelStrategyHost = object  # a base for the type checker only (hosts.py)

__all__ = ["HPUParallelMixin"]


class HPUParallelMixin(ParallelStrategyHost):
    """What every multi-card HPU strategy adds to its Lightning base, the Trainer's and Fabric's: the card, HCCL, reduce
    semantics, the launcher choice, the collective timeout and the progress reports that name a stuck rank.

    Each flavour's adapter (hpu_nb.core.strategies.parallel.HPUTrainerParallelMixin, hpu_nb.core.fabric.strategies)
    puts it first in its bases and supplies its launchers (`_script_launcher`, `_process_launcher`).
    """

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
        with rank_processes.joining_process_group(self._start_up_interrupted_line):
            super().setup_environment()  # Lightning's: the card, then the process group
        self._start_progress_reports()

    @property
    def _start_up_interrupted_line(self) -> str:
        """The one line for an interrupt while the ranks join the process group (before any step)."""
        return stopped_message(None, trainer=True)

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
        """HCCL set-up (`setup_hccl_env`); returns the process-group backend."""
        self.setup_hccl_env()
        self._process_group_backend = self._process_group_backend or hpu_dist.process_group_backend()
        return self._process_group_backend

    def setup_hccl_env(self) -> None:
        """Get this process ready for HCCL: import it (it registers "hccl") and `initialize_distributed_hpu` (it binds
        the rank to its card). lightning-habana's hook, kept for its subclasses (override it and call super()). Called
        right before the process group is made, by every HPU strategy (the plugin called it from `setup_environment`,
        which DeepSpeed's and FSDP's set-ups do not pass through here)."""
        hpu_dist.initialize_distributed(
            world_size=self.world_size,
            rank=self.global_rank,
            local_rank=self.local_rank,
            local_world_size=self.num_processes,
        )

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
        """The launcher that runs the script again per card: each flavour's (ScriptLivenessMixin on Lightning's)."""
        raise NotImplementedError

    def _process_launcher(self, start_method: ProcessStartMethod) -> Any:
        """The fork / spawn launcher: each flavour's (WorkerLivenessMixin on Lightning's)."""
        raise NotImplementedError

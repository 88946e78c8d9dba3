"""HPUParallelStrategy / HPUDDPStrategy: one process per Gaudi card, DDP over HCCL (the Trainer's).

What every multi-card HPU strategy adds to its Lightning base (the card, HCCL and its reduce semantics, the launcher
choice and fork check, liveness) is shared with Fabric: hpu_nb.core.strategy_parts. `HPUTrainerParallelMixin` adapts it
to the Trainer: its steps, tracked for the progress reports that name a stuck rank, lazy mode's mark_step
(`HPUStepsMixin`), and the Trainer's launchers (launchers.py).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
from lightning.pytorch.strategies.ddp import DDPStrategy
from typing_extensions import override

from hpu_nb.core import noise
from hpu_nb.core.strategies.hpu_steps import HPUStepsMixin
from hpu_nb.core.strategies.launchers import HPUMultiProcessingLauncher, HPUSubprocessScriptLauncher
from hpu_nb.core.strategy_parts.collectives import REDUCE_OPS, hccl_reduce, reduce_op_name
from hpu_nb.core.strategy_parts.launchers import (
    START_METHODS,
    ForkCheckMixin,
    ProcessStartMethod,
    ScriptLivenessMixin,
    StartMethod,
    WorkerLivenessMixin,
    in_interactive_session,
    one_cpu_thread_after_fork,
    resolve_start_method,
)
from hpu_nb.core.strategy_parts.parallel import HPUParallelMixin

__all__ = [  # the shared pieces too, importable here as before
    "REDUCE_OPS", "START_METHODS", "ForkCheckMixin", "HPUDDPStrategy", "HPUMultiProcessingLauncher", "HPUParallelMixin",
    "HPUParallelStrategy", "HPUSubprocessScriptLauncher", "HPUTrainerParallelMixin", "ProcessStartMethod",
    "ScriptLivenessMixin", "StartMethod", "WorkerLivenessMixin", "hccl_reduce", "in_interactive_session",
    "one_cpu_thread_after_fork", "reduce_op_name", "resolve_start_method",
]


class HPUTrainerParallelMixin(HPUParallelMixin, HPUStepsMixin):
    """Put first in the bases of a Trainer's multi-card HPU strategy: `class S(HPUTrainerParallelMixin, DDPStrategy)`.

    The shared HPUParallelMixin, HPUStepsMixin, the Trainer's steps tracked for the progress reports, and the
    Trainer's launchers."""

    _ddp_time_stats_quiet = noise.OnceNativeMessage(noise.DDP_TIME_STATS)  # each worker process: its own copy

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
    def _script_launcher(self) -> Any:
        return HPUSubprocessScriptLauncher(self, self.cluster_environment, self.num_processes, self.num_nodes)

    @override
    def _process_launcher(self, start_method: ProcessStartMethod) -> Any:
        return HPUMultiProcessingLauncher(self, start_method=start_method)


class HPUParallelStrategy(HPUTrainerParallelMixin, DDPStrategy):
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

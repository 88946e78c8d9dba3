"""HPUParallelStrategy / HPUDDPStrategy: one process per Gaudi card, DDP over HCCL.

`HPUParallelMixin` holds what every multi-card HPU strategy (DDP, DeepSpeed, FSDP; for the Trainer and for Fabric)
adds to its Lightning base:
- the process group: HCCL prepared by the runtime (`initialize_distributed_hpu`) before `init_process_group`;
- HCCL's reduce semantics (sum / min / max, mean = sum / world size), used everywhere so scripts behave alike on
  the emulated Gaudi and on a Gaudi;
- launching: Lightning's script launcher (`popen`) from a script or under torchrun / SLURM, and a fork launcher in
  a notebook (the only kind Lightning accepts there); each worker drives its own card (hpu:0 of its process);
- devices: every process's card is `hpu:0`, so `parallel_devices=[torch.device("hpu")] * n` gives each rank the
  root device hpu:0.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.utilities.distributed import _distributed_is_initialized
from lightning.pytorch.strategies.ddp import DDPStrategy
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from torch import Tensor
from typing_extensions import override

from hpu_nb.core.strategies.hpu_steps import HPUStepsMixin
from hpu_nb.runtime import distributed as hpu_dist
from hpu_nb.runtime import get_backend

__all__ = ["ForkCheckMixin", "HPUDDPStrategy", "HPUParallelMixin", "HPUParallelStrategy", "hccl_reduce"]

START_METHODS = ("popen", "fork", "spawn", "forkserver")
REDUCE_OPS = ("sum", "min", "max", "mean")


# -- HCCL reduce semantics ------------------------------------------------------------------------------------------
def reduce_op_name(reduce_op: Any) -> str:
    """'sum' | 'min' | 'max' | 'mean' for a string or ReduceOp; a clear error for what HCCL cannot do."""
    from torch.distributed import ReduceOp

    if reduce_op is None:
        return "mean"
    if isinstance(reduce_op, str):
        name = reduce_op.strip().lower()
        name = "mean" if name == "avg" else name
        if name in REDUCE_OPS:
            return name
    else:
        for name, op in (("sum", ReduceOp.SUM), ("min", ReduceOp.MIN), ("max", ReduceOp.MAX), ("mean", ReduceOp.AVG)):
            try:
                if reduce_op == op:
                    return name
            except TypeError:
                break
    raise ValueError(
        f"reduce_op={reduce_op!r} is not supported on HPU: HCCL reduces with 'sum', 'min' or 'max', and 'mean'"
        " (= sum / world size)."
    )


def hccl_reduce(tensor: Tensor, group: Any = None, reduce_op: Any = "mean") -> Tensor:
    """All-reduce `tensor` across the group the way HCCL does; integer tensors are cast to float for a mean.

    sum / min / max reduce in place, like Lightning's DDP reduce. Without a process group the tensor comes back as is.
    """
    name = reduce_op_name(reduce_op)
    if not isinstance(tensor, Tensor) or not _distributed_is_initialized():
        return tensor
    from torch.distributed import ReduceOp

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
    from lightning.pytorch.trainer.connectors import accelerator_connector

    return bool(accelerator_connector._IS_INTERACTIVE)


def resolve_start_method(start_method: str | None) -> str:
    """None / "auto": fork in a notebook (Lightning requires it there), Lightning's script launcher elsewhere."""
    if start_method in (None, "auto"):
        return "fork" if in_interactive_session() and "fork" in torch.multiprocessing.get_all_start_methods() else "popen"
    if start_method not in START_METHODS:
        raise ValueError(f"start_method={start_method!r} is not one of: auto, {', '.join(START_METHODS)}.")
    return start_method


class ForkCheckMixin:
    """For a fork / spawn launcher (Trainer's or Fabric's): refuse to fork a Gaudi runtime this process has opened."""

    _start_method: str

    @override
    def launch(self, function: Callable, *args: Any, **kwargs: Any) -> Any:
        if self._start_method in ("fork", "forkserver"):
            hpu_dist.check_fork_allowed()
        return super().launch(function, *args, **kwargs)  # type: ignore[misc]


class HPUMultiProcessingLauncher(ForkCheckMixin, _MultiProcessingLauncher):
    """Lightning's fork/spawn launcher for the Trainer, with the Gaudi fork check."""


class HPUParallelMixin:
    """Put first in the bases of a multi-card HPU strategy: `class S(HPUParallelMixin, HPUStepsMixin, DDPStrategy)`."""

    _start_method: str | None = None

    def __init__(self, *args: Any, start_method: str | None = "auto", **kwargs: Any) -> None:
        """start_method: "auto" (fork in a notebook, Lightning's script launcher elsewhere), "popen", "fork", "spawn"
        or "forkserver"; checked now, resolved when the launcher is configured."""
        resolve_start_method(start_method)
        super().__init__(*args, **kwargs)
        self._start_method = start_method

    # -- devices --------------------------------------------------------------------------------------------------
    @property
    @override
    def root_device(self) -> torch.device:
        """This process's card: hpu:0 (an `hpu` device without an index is completed, as torch's FSDP needs one)."""
        assert self.parallel_devices is not None, "the strategy has no devices yet (it gets them from the Trainer)"
        device = self.parallel_devices[self.local_rank]  # type: ignore[attr-defined]
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
        return self._process_group_backend or hpu_dist.process_group_backend()  # type: ignore[attr-defined]

    @override
    def _get_process_group_backend(self) -> str:
        """Called by Lightning (Trainer and Fabric, DDP and FSDP) right before `init_process_group`: prepare HCCL."""
        return self._prepare_hpu_distributed()

    def _prepare_hpu_distributed(self) -> str:
        """HCCL set-up on a Gaudi (import, initialize_distributed_hpu); returns the process-group backend."""
        backend = hpu_dist.initialize_distributed(
            world_size=self.world_size,  # type: ignore[attr-defined]
            rank=self.global_rank,  # type: ignore[attr-defined]
            local_rank=self.local_rank,  # type: ignore[attr-defined]
            local_world_size=self.num_processes,  # type: ignore[attr-defined]
        )
        self._process_group_backend = self._process_group_backend or backend  # type: ignore[attr-defined]
        return self._process_group_backend  # type: ignore[attr-defined]

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
            return hccl_reduce(tensor, group, reduce_op)
        return tensor

    @override
    def all_reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:  # Fabric's name
        return HPUParallelMixin.reduce(self, tensor, group, reduce_op)

    # -- launching ------------------------------------------------------------------------------------------------
    @override
    def _configure_launcher(self) -> None:
        """Lightning's script launcher (its own process per card), or fork / spawn (a notebook: fork)."""
        assert self.cluster_environment is not None  # type: ignore[attr-defined]
        script_launcher, multiprocessing_launcher = self._launcher_classes()
        method = resolve_start_method(self._start_method)
        if method == "popen" or self.cluster_environment.creates_processes_externally:  # type: ignore[attr-defined]
            self._launcher = script_launcher(
                self.cluster_environment, self.num_processes, self.num_nodes  # type: ignore[attr-defined]
            )
        else:
            self._launcher = multiprocessing_launcher(self, start_method=method)

    def _launcher_classes(self) -> tuple[type, type]:
        """(script launcher, fork/spawn launcher): the Trainer's; Fabric strategies return Fabric's."""
        return _SubprocessScriptLauncher, HPUMultiProcessingLauncher


class HPUParallelStrategy(HPUParallelMixin, HPUStepsMixin, DDPStrategy):
    """DDP across Gaudi cards over HCCL (gloo on the emulated Gaudi), chosen for `Trainer(accelerator="hpu", devices>1)`.

    start_method: "auto" (fork in a notebook, Lightning's script launcher elsewhere), "popen", "fork" or "spawn".
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
        ddp_comm_hook: Callable | None = None,
        ddp_comm_wrapper: Callable | None = None,
        model_averaging_period: int | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
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
        strategy_registry.register(cls.strategy_name, cls, description=cls.__doc__.splitlines()[0], override=True)


class HPUDDPStrategy(HPUParallelStrategy):
    """The same strategy under the name DDP users look for: `Trainer(accelerator="hpu", strategy="hpu_ddp")`."""

    strategy_name = "hpu_ddp"

"""HPUParallelStrategy / HPUDDPStrategy: one process per Gaudi card, DDP over HCCL (gloo on the emulated Gaudi).

`HPUParallelMixin` holds what every multi-card HPU strategy (DDP, DeepSpeed, FSDP) adds to its Lightning base:
- the process group: HCCL prepared by the runtime (`initialize_distributed_hpu`) before `init_process_group`;
- HCCL's reduce semantics (sum / min / max, mean = sum / world size), used everywhere so scripts behave alike on
  the emulated Gaudi and on a Gaudi;
- launching: Lightning's script launcher (`popen`) from a script or under torchrun / SLURM, and a fork launcher in
  a notebook (the only kind Lightning accepts there) whose workers each drive a fresh emulated card;
- devices: `parallel_devices=[torch.device("hpu")] * n` means this backend's root device (cpu when emulated), kept
  out of sight of Lightning's connector check that would otherwise turn a cpu root device into accelerator="cpu".
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.utilities.distributed import _distributed_is_initialized, _init_dist_connection
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.strategies.ddp import DDPStrategy
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from torch import Tensor

from hpu_nb.core.strategies.hpu_steps import HPUStepsMixin
from hpu_nb.runtime import distributed as hpu_dist
from hpu_nb.runtime import get_backend

__all__ = ["HPUDDPStrategy", "HPUParallelMixin", "HPUParallelStrategy", "hccl_reduce"]

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
        forkable = "fork" in torch.multiprocessing.get_all_start_methods()
        return "fork" if in_interactive_session() and forkable else "popen"
    if start_method not in START_METHODS:
        raise ValueError(f"start_method={start_method!r} is not one of: auto, {', '.join(START_METHODS)}.")
    return start_method


class HPUMultiProcessingLauncher(_MultiProcessingLauncher):
    """Lightning's fork/spawn launcher, plus: refuse to fork an open Gaudi runtime, and give each worker its own
    card.
    """

    def launch(self, function: Callable, *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        if self._start_method in ("fork", "forkserver"):
            hpu_dist.check_fork_allowed()
        return super().launch(function, *args, trainer=trainer, **kwargs)

    def _wrapping_function(self, process_idx: int, *args: Any, **kwargs: Any) -> None:
        hpu_dist.prepare_forked_worker(process_idx)
        return super()._wrapping_function(process_idx, *args, **kwargs)


def _backend_devices(devices: list[Any] | None) -> list[torch.device] | None:
    """"hpu" devices mean this backend's root device (cpu on the emulated Gaudi)."""
    if devices is None:
        return None
    root = get_backend().root_device()
    out = []
    for device in devices:
        device = torch.device(device) if not isinstance(device, torch.device) else device
        out.append(root if device.type == "hpu" else device)
    return out


class HPUParallelMixin:
    """Put first in the bases of a multi-card HPU strategy: `class S(HPUParallelMixin, HPUStepsMixin, DDPStrategy)`."""

    _start_method: str | None = None

    # -- devices --------------------------------------------------------------------------------------------------
    @property
    def parallel_devices(self) -> list[torch.device] | None:
        return self.__dict__.get("_hpu_devices")

    @parallel_devices.setter
    def parallel_devices(self, devices: list[Any] | None) -> None:
        devices = _backend_devices(devices)
        if "_hpu_requested_devices" not in self.__dict__:  # first call: from __init__
            # Hidden until the connector assigns devices: a visible cpu root device would make it pick
            # accelerator="cpu".
            self._hpu_requested_devices = devices
            self._hpu_devices = None
            return
        # The connector assigns the accelerator's devices; a list given to the strategy wins, as in Lightning.
        self._hpu_devices = self._hpu_requested_devices or devices

    @property
    def root_device(self) -> torch.device:
        assert self.parallel_devices is not None, "the strategy has no devices yet (it gets them from the Trainer)"
        return self.parallel_devices[self.local_rank]  # type: ignore[attr-defined]

    def determine_ddp_device_ids(self) -> list[int] | None:
        return None  # one card per process: the process's own device, as on CPU

    # -- process group --------------------------------------------------------------------------------------------
    def _get_process_group_backend(self) -> str:
        return self._process_group_backend or hpu_dist.process_group_backend()  # type: ignore[attr-defined]

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

    def _init_hpu_process_group(self) -> None:
        reset_seed()
        self.set_world_ranks()  # type: ignore[attr-defined]
        backend = self._prepare_hpu_distributed()
        _init_dist_connection(self.cluster_environment, backend, timeout=self._timeout)  # type: ignore[attr-defined]

    # -- collectives ----------------------------------------------------------------------------------------------
    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        """HCCL semantics: sum / min / max natively, mean as sum / world size (ints become float)."""
        if isinstance(tensor, Tensor):
            return hccl_reduce(tensor, group, reduce_op)
        return tensor

    # -- launching ------------------------------------------------------------------------------------------------
    def _configure_launcher(self) -> None:
        assert self.cluster_environment is not None  # type: ignore[attr-defined]
        method = resolve_start_method(self._start_method)
        if method == "popen" or self.cluster_environment.creates_processes_externally:  # type: ignore[attr-defined]
            self._launcher = _SubprocessScriptLauncher(
                self.cluster_environment, self.num_processes, self.num_nodes  # type: ignore[attr-defined]
            )
        else:
            self._launcher = HPUMultiProcessingLauncher(self, start_method=method)  # type: ignore[arg-type]


class HPUParallelStrategy(HPUParallelMixin, HPUStepsMixin, DDPStrategy):
    """DDP across Gaudi cards over HCCL (gloo on the emulated Gaudi), chosen for
    `Trainer(accelerator="hpu", devices>1)`.

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
        resolve_start_method(start_method)  # validate early
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
            **kwargs,
        )
        self._start_method = start_method

    def setup_distributed(self) -> None:
        self._init_hpu_process_group()

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(cls.strategy_name, cls, description=cls.__doc__.splitlines()[0], override=True)


class HPUDDPStrategy(HPUParallelStrategy):
    """The same strategy under the name DDP users look for: `Trainer(accelerator="hpu", strategy="hpu_ddp")`."""

    strategy_name = "hpu_ddp"

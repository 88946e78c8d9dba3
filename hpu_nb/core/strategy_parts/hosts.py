"""What the shared HPU mixins' hosts provide, declared for the type checker: Lightning's strategies and launchers.

A mixin of this package (`HPUParallelMixin`, the launcher mixins, `HPUFSDPPrecisionMixin`) extends methods of the
Lightning class it is mixed into, and serves two class trees: the Trainer's (`lightning.pytorch`) and Fabric's
(`lightning.fabric`). It cannot name either as its base, so it takes one of these classes as its base while type
checking only (a mixin of one flavour names that flavour's real Lightning class instead):

    if TYPE_CHECKING:
        from hpu_nb.core.strategy_parts.hosts import ParallelStrategyHost
    else:
        ParallelStrategyHost = object

At run time the mixins' bases are unchanged and this module is never imported. Each class lists the part of both
trees its mixin uses, with signatures every host accepts (Lightning 2.6). The bodies are `...`: declarations only,
hence mypy's empty-body check is off for this module.
"""

# mypy: disable-error-code="empty-body"

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from lightning.fabric.plugins.environments import ClusterEnvironment
from torch.distributed.fsdp import MixedPrecision
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler


class LauncherHost:
    """Lightning's `_MultiProcessingLauncher` and `_SubprocessScriptLauncher`, the Trainer's and Fabric's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None: ...

    def launch(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any: ...

    def _call_children_scripts(self) -> None: ...  # the script launchers'


class ParallelStrategyHost:
    """Lightning's DDP, DeepSpeed and FSDP strategies, the Trainer's and Fabric's, what `HPUParallelMixin` extends.

    Methods only one tree has (the Trainer's `reduce`, Fabric's `all_reduce`) are declared for both: the mixin
    overrides both, and a tree that lacks one never calls it.
    """

    cluster_environment: ClusterEnvironment | None
    parallel_devices: list[torch.device] | None
    _process_group_backend: str | None
    _launcher: Any  # the Trainer's or Fabric's _Launcher

    def __init__(self, *args: Any, **kwargs: Any) -> None: ...

    @property
    def world_size(self) -> int: ...

    @property
    def global_rank(self) -> int: ...

    @property
    def local_rank(self) -> int: ...

    @property
    def num_processes(self) -> int: ...

    @property
    def num_nodes(self) -> int: ...

    @num_nodes.setter
    def num_nodes(self, num_nodes: int) -> None: ...

    @property
    def root_device(self) -> torch.device: ...

    @property
    def process_group_backend(self) -> str | None: ...

    def setup_environment(self) -> None: ...

    def teardown(self) -> None: ...

    def backward(self, *args: Any, **kwargs: Any) -> Any: ...

    def optimizer_step(self, *args: Any, **kwargs: Any) -> Any: ...

    def barrier(self, *args: Any, **kwargs: Any) -> None: ...

    def broadcast(self, *args: Any, **kwargs: Any) -> Any: ...

    def all_gather(self, *args: Any, **kwargs: Any) -> Any: ...

    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any: ...

    def all_reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any: ...

    def determine_ddp_device_ids(self) -> list[int] | None: ...

    def _determine_ddp_device_ids(self) -> list[int] | None: ...

    def _get_process_group_backend(self) -> str: ...

    def _configure_launcher(self) -> None: ...


class FSDPPrecisionHost:
    """Lightning's two FSDPPrecision classes, the Trainer's and Fabric's (they share no base but Fabric's Precision),
    what `HPUFSDPPrecisionMixin` (fsdp.py) extends."""

    precision: Any  # Lightning's precision names (a Literal of its own): the HPU plugins hold one of them
    scaler: ShardedGradScaler | None

    def __init__(self, precision: Any, scaler: ShardedGradScaler | None = None) -> None: ...

    @property
    def mixed_precision_config(self) -> MixedPrecision: ...

    def forward_context(self) -> AbstractContextManager[Any]: ...

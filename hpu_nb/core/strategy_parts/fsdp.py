"""FSDP on HPU, what the Trainer's and Fabric's FSDP share: the rules (eager mode only, the precisions FSDP runs), and
what FSDP precision means on HPU (`HPUFSDPPrecisionMixin`, on each flavour's FSDPPrecision: Lightning's two
FSDPPrecision classes share no base).

Habana runs FSDP in eager mode only (PT_HPU_LAZY_MODE=0, set before Python starts); the emulated Gaudi follows the
same rule so a script that runs here runs on a Gaudi.
"""

from __future__ import annotations

import functools
import warnings
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.distributed._shard.sharded_tensor import custom_sharded_op_impl
from torch.distributed.fsdp import MixedPrecision
from typing_extensions import override

from hpu_nb.core.issues import Issue
from hpu_nb.core.mixed_precision import autocast_context, loss_scaler
from hpu_nb.core.precision_names import autocast_dtype, precision_dtype, unify_precision
from hpu_nb.core.precision_rules import generation_issues
from hpu_nb.runtime import get_backend
from hpu_nb.runtime.base import DeviceBackend

if TYPE_CHECKING:
    from hpu_nb.core.strategy_parts.hosts import FSDPPrecisionHost
else:
    FSDPPrecisionHost = object  # a base for the type checker only (hosts.py)

__all__ = ["FSDP_PRECISIONS", "HPUFSDPPrecisionMixin", "check_eager_mode", "fsdp_issues", "sharded_tensors_on_hpu",
           "validate_fsdp_precision"]

FSDP_PRECISIONS = ("32-true", "bf16-mixed", "bf16-true", "16-mixed", "16-true")


# -- the rules of an FSDP configuration: written once, raised by the strategy and its precision, shown by the widget --
def fsdp_issues(*, backend: DeviceBackend | None = None, precision: str | int | None = None) -> list[Issue]:
    """What is wrong with FSDP here: `backend`'s execution mode (FSDP runs in eager mode only), `precision` (one of
    FSDP_PRECISIONS: no fp8). Each issue names "strategy" or "precision"."""
    issues: list[Issue] = []
    if backend is not None and backend.is_lazy():
        # says plainly which Gaudi this is: the rule is the same on both
        where = "the emulated Gaudi follows Gaudi's rule" if backend.is_emulated else "this Gaudi is in lazy mode"
        issues.append(Issue("strategy", (
            f"HPUFSDPStrategy runs in eager mode only, and {where}: set PT_HPU_LAZY_MODE=0 in the environment before"
            " Python starts (e.g. `PT_HPU_LAZY_MODE=0 python train.py`, or in the notebook kernel's environment, then"
            " restart the kernel).")))
    if precision is not None and unify_precision(precision) not in FSDP_PRECISIONS:
        fp8 = ("fp8 is not available with the fsdp strategy here; use single, parallel / DDP or DeepSpeed. "
               if str(precision).startswith("fp8") else "")
        issues.append(Issue("precision", f"{fp8}HPUFSDPPrecision(precision={precision!r}): choose one of"
                                         f" {', '.join(FSDP_PRECISIONS)}."))
    return issues


def check_eager_mode() -> None:
    """FSDP on Gaudi needs eager mode; lazy mode is the default, so say how to switch."""
    for issue in fsdp_issues(backend=get_backend()):
        raise MisconfigurationException(issue.message)


def validate_fsdp_precision(precision: str | int) -> str:
    """Lightning's unified name of an FSDP precision on HPU; fp16 needs Gaudi2 or newer (Trainer and Fabric)."""
    for issue in fsdp_issues(precision=precision):
        raise ValueError(issue.message)
    unified = unify_precision(precision)
    assert unified is not None
    for issue in generation_issues(unified, get_backend()):
        raise ValueError(issue.message)
    return unified


# -- sharded checkpoints: torch's ShardedTensor asks CUDA for the device of a rank that holds no shard ---------------
def _sharded_tensor_device(types: Any, args: Any = (), kwargs: Any = None, pg: Any = None) -> torch.device:
    """`ShardedTensor.device` as torch's own rule (torch/distributed/_shard/sharded_tensor/_ops/tensor_ops.py
    `tensor_device`: the local shard's device, the CPU for gloo, else `torch.cuda.current_device()`), with the HCCL
    group's device, the current HPU, where torch would ask CUDA: a rank with no shard of a small parameter (a bias of
    fewer elements than ranks) otherwise fails a sharded checkpoint's load with "Torch not compiled with CUDA enabled",
    on a Gaudi as on the emulated one."""
    sharded = args[0]
    if sharded._local_shards:
        local: torch.Tensor = sharded._local_shards[0].tensor
        return local.device
    backend = pg._get_backend_name() if pg is not None else None
    if backend == "gloo":
        return torch.device("cpu")
    if backend == "hccl":
        return torch.device("hpu", torch.hpu.current_device())  # type: ignore[attr-defined]
    return torch.device(torch.cuda.current_device())


@functools.cache
def sharded_tensors_on_hpu() -> None:
    """Register `_sharded_tensor_device` with torch's public hook for custom ShardedTensor ops (once per process)."""
    custom_sharded_op_impl(torch.Tensor.device.__get__)(_sharded_tensor_device)  # type: ignore[no-untyped-call]


class HPUFSDPPrecisionMixin(FSDPPrecisionHost):
    """What FSDP precision means on HPU, for the Trainer's plugin and Fabric's (each also a Lightning FSDPPrecision).

    FSDP's MixedPrecision as lightning-habana had it: "-mixed" keeps the parameters in float32 (autocast computes in
    the lower dtype) and reduces / keeps buffers in the lower dtype; "-true" casts all. Forward runs under autocast on
    "hpu" for the "-mixed" precisions; the others need nothing (the parameters carry the dtype).
    """

    scaler: Any

    def _init_fsdp_precision(self, precision: str | int, scaler: Any) -> None:
        """Lightning's FSDPPrecision set-up, with the loss scaler of "16-mixed" on "hpu" (an HPUShardedGradScaler):
        Lightning's own is CUDA's (disabled here, with a warning) and a scaler given to it is dropped, so it is set
        after."""
        unified = validate_fsdp_precision(precision)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*CUDA is not available", category=UserWarning)
            super().__init__(unified)
        self.scaler = loss_scaler(unified, scaler, sharded=True)

    @property
    @override
    def mixed_precision_config(self) -> MixedPrecision:
        lower = precision_dtype(self.precision)
        param_dtype = torch.float32 if self.precision.endswith("-mixed") else lower
        return MixedPrecision(param_dtype=param_dtype, reduce_dtype=lower, buffer_dtype=lower)

    @override
    def forward_context(self) -> AbstractContextManager[None]:
        if autocast_dtype(self.precision) is not None:  # "-mixed": autocast on "hpu", as HPUPrecision's
            return autocast_context(self.precision)
        return nullcontext()

"""HCCL's reduce semantics, for every multi-card HPU strategy (Trainer and Fabric, DDP, DeepSpeed and FSDP): sum /
product / min / max natively, mean as sum / world size, so scripts behave alike on the emulated Gaudi and on a Gaudi."""

from __future__ import annotations

from typing import Any

import torch
from lightning.fabric.utilities.distributed import _distributed_is_initialized
from torch import Tensor
from torch.distributed import ReduceOp

__all__ = ["REDUCE_OPS", "SUPPORTED_REDUCE_OPS", "hccl_reduce", "reduce_op_name"]

REDUCE_OPS = ("sum", "product", "min", "max", "mean")  # HCCL's (the bridge's hccl_kernels.cpp), mean = sum / size
# HCCL's native reductions by name, in lightning-habana's order (its `supported_reduce_ops` had sum, min, max; HCCL
# also multiplies, hcclProd, and hpu_nb accepts it). Mean is sum / world size, said apart in the error below.
SUPPORTED_REDUCE_OPS = {"sum": ReduceOp.SUM, "min": ReduceOp.MIN, "max": ReduceOp.MAX, "product": ReduceOp.PRODUCT}


def reduce_op_name(reduce_op: Any) -> str:
    """'sum' | 'product' | 'min' | 'max' | 'mean' for a string or ReduceOp; a TypeError for what HCCL cannot do, whose
    message starts as lightning-habana's ("Unsupported ReduceOp <op>. Supported ops in HCCL are: sum, min, ...")."""
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
    shown = reduce_op.strip().lower() if isinstance(reduce_op, str) else reduce_op
    raise TypeError(
        f"Unsupported ReduceOp {shown}. Supported ops in HCCL are: {', '.join(SUPPORTED_REDUCE_OPS)}; and 'mean'"
        f" (= sum / world size). reduce_op={reduce_op!r} is not supported on HPU."
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

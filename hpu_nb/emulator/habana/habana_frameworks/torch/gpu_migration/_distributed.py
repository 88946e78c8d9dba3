"""torch.distributed's NCCL calls on HCCL, as Habana's toolkit maps them (its `torch/distributed/distributed_c10d.py`,
read for behaviour, not copied): `init_process_group("nccl")` or with no backend runs on "hccl"; `new_group` with a
backend naming nccl / cuda gets hccl / hpu; `get_backend()` answers "nccl" where the group runs HCCL (CUDA code checks
`backend in ("gloo", "nccl")`); `is_nccl_available()` is True where HCCL imports; `barrier(device_ids=...)` drops the
ids (an NCCL-only argument); `DistributedDataParallel(..., device_ids=..., output_device=...)` has both set to None.
Unlike Habana's 1.19 toolkit, every other argument (device_id included) is passed on.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from habana_frameworks.torch.gpu_migration._log import HPU_MATCH, LOG


def _with_hccl(backend: Any) -> Any:
    if isinstance(backend, str):
        return backend.replace("nccl", "hccl").replace("cuda", "hpu")
    return backend


def install(replace: Callable[[Any, str, Any], None]) -> None:
    if not dist.is_available():
        return
    original_init = dist.init_process_group
    original_new_group = dist.new_group
    original_get_backend = dist.get_backend
    original_barrier = dist.barrier

    def init_process_group(backend: str | None = None, *args: Any, **kwargs: Any) -> Any:
        if backend is None or backend == "nccl":
            LOG.record(HPU_MATCH, "torch.distributed.init_process_group", {"backend": backend, **kwargs},
                       "change backend to hccl")
            backend = "hccl"
        return original_init(backend, *args, **kwargs)

    def new_group(*args: Any, **kwargs: Any) -> Any:
        backend = kwargs.get("backend")
        if isinstance(backend, str) and ("nccl" in backend or "cuda" in backend):
            kwargs["backend"] = _with_hccl(backend)
            LOG.record(HPU_MATCH, "torch.distributed.new_group", {"backend": backend},
                       f"change backend to {kwargs['backend']}")
        return original_new_group(*args, **kwargs)

    def get_backend(group: Any = None) -> Any:
        backend = original_get_backend(group)
        if backend == "hccl":
            LOG.record(HPU_MATCH, "torch.distributed.get_backend", None, "change return value from hccl to nccl")
            return "nccl"
        return backend

    def is_nccl_available() -> bool:
        try:
            import habana_frameworks.torch.distributed.hccl  # noqa: F401, PLC0415 -- the question is whether it imports
        except ImportError:
            return False
        LOG.record(HPU_MATCH, "torch.distributed.is_nccl_available", None, "change return value to True")
        return True

    def barrier(group: Any = None, async_op: bool = False, device_ids: Any = None) -> Any:
        if device_ids:
            LOG.record(HPU_MATCH, "torch.distributed.barrier", {"device_ids": device_ids},
                       f"torch.distributed.barrier(group={group}, async_op={async_op}, device_ids=None)")
        return original_barrier(group=group, async_op=async_op)

    for function in (init_process_group, new_group, get_backend, is_nccl_available, barrier):
        replace(dist, function.__name__, function)
    replace(torch.nn.parallel.DistributedDataParallel, "__init__", _ddp_init())


def _ddp_init() -> Callable[..., None]:
    """DistributedDataParallel(module, device_ids=[local_rank], ...) as Habana's toolkit runs it: CUDA's device ids
    (and output device) set to None, a Gaudi process driving its one card; logged as Habana's logs show it
    (Model-References' gpu_migration logs: every argument, the module written `module`)."""
    original_init = torch.nn.parallel.DistributedDataParallel.__init__
    signature = inspect.signature(original_init)

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        if bound.arguments.get("device_ids") is not None or bound.arguments.get("output_device") is not None:
            shown = {name: "module" if name == "module" else value for name, value in bound.arguments.items()
                     if name != "self"}
            LOG.record(HPU_MATCH, "torch.nn.parallel.DistributedDataParallel.__init__", shown,
                       "change device_ids and output_device to None")
            bound.arguments["device_ids"] = bound.arguments["output_device"] = None
        original_init(*bound.args, **bound.kwargs)

    return __init__

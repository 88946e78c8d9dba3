"""Fake habana_frameworks.torch.distributed.hccl: importing it registers the "hccl" backend for the hpu device.

The collectives are hpu_nb's emulated HCCL (gloo on the hpu tensors' host memory), so a process group created with
backend="hccl" really communicates, and refuses host tensors as HCCL does; uninstalling the fake unregisters it.
"""

import os

from habana_frameworks._fake import STATE as _STATE
from habana_frameworks._fake import recorded as _recorded

_STATE.calls.record("import habana_frameworks.torch.distributed.hccl")


def _register():
    import torch.distributed as dist

    from hpu_nb.runtime.hpu_device import hccl

    if not dist.is_available():
        return
    hccl.register()
    _STATE.originals["hccl registered"] = True


_register()


@_recorded
def initialize_distributed_hpu(world_size=None, rank=None, local_rank=None):
    """Resolve (world_size, rank, local_rank) from the arguments or the launcher's environment and export them."""
    env = os.environ
    world_size = int(world_size if world_size is not None else env.get("WORLD_SIZE", 1))
    rank = int(rank if rank is not None else env.get("RANK", 0))
    local_rank = int(local_rank if local_rank is not None else env.get("LOCAL_RANK", rank))
    env["WORLD_SIZE"], env["RANK"], env["LOCAL_RANK"] = str(world_size), str(rank), str(local_rank)
    env["ID"] = str(rank)
    modules = [m.strip() for m in env.get("HABANA_VISIBLE_MODULES", "").split(",") if m.strip()]
    if modules:
        env["HLS_MODULE_ID"] = modules[local_rank % len(modules)]
    return world_size, rank, local_rank

"""Fake habana_frameworks.torch.distributed.hccl: importing it registers an "hccl" process-group backend.

Here "hccl" is gloo underneath (for CPU tensors), so a process group created with backend="hccl" really
communicates; uninstalling the fake (tests/fake_habana) unregisters it again.
"""

import os

from habana_frameworks._fake import STATE as _STATE
from habana_frameworks._fake import recorded as _recorded

_STATE.calls.record("import habana_frameworks.torch.distributed.hccl")


def _create_gloo_backed_hccl(store, rank, world_size, timeout):
    import torch.distributed as dist

    return dist.ProcessGroupGloo(store, rank, world_size, timeout)


def _register():
    import torch.distributed as dist

    if not dist.is_available() or "hccl" in dist.Backend.backend_list:
        return
    dist.Backend.register_backend("hccl", _create_gloo_backed_hccl, devices=["hpu", "cpu"])
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

"""Fake habana_frameworks.torch.distributed.hccl: what importing Habana's module does (distributed/hccl/__init__.py).

On import it reads int(PT_HPU_LAZY_MODE) (a non-integer value fails the import) and calls
`initialize_distributed_hpu()` from the environment: Open MPI's variables are copied to
WORLD_SIZE / RANK / LOCAL_RANK unless all three are set, and then MASTER_ADDR / MASTER_PORT default to localhost /
12345 (so two jobs on one machine that do not set their own port collide); HLS_MODULE_ID is set for the local rank
(from HABANA_VISIBLE_MODULES when set) when the world has more than one process. It registers the "hccl" backend for
the hpu device only; the collectives are hpu_nb's emulated HCCL (gloo on the hpu tensors' host memory), so a process
group created with backend="hccl" really communicates and refuses host tensors as HCCL does.
"""

import os

from habana_frameworks._fake import STATE as _STATE
from habana_frameworks._fake import recorded as _recorded
from habana_frameworks.torch.hpu import HABANA_VISIBLE_MODULES_VAR, HLS_MODULE_ID_VAR  # noqa: F401  (as Habana's)

_STATE.calls.record("import habana_frameworks.torch.distributed.hccl")
# Import-time check, as Habana's: the mode picks the collectives' C module with int(PT_HPU_LAZY_MODE), so a value
# that is not an integer ("false", "eager") fails the import with ValueError.
_lazy_mode = int(os.environ.get("PT_HPU_LAZY_MODE", "1" if _STATE.config.lazy_by_default else "0"))
_lazy_collectives_enabled = os.environ.get("PT_HPU_ENABLE_LAZY_COLLECTIVES", "False").lower() in ["true", "1"]
_MPI = {"OMPI_COMM_WORLD_LOCAL_RANK": "LOCAL_RANK", "OMPI_COMM_WORLD_SIZE": "WORLD_SIZE",
        "OMPI_COMM_WORLD_RANK": "RANK"}


def _setup_module_id(local_rank=-1, world_size=1):
    if "HLS_MODULE_ID" in os.environ or local_rank == -1 or world_size == 1:
        return
    if "HABANA_VISIBLE_MODULES" in os.environ:
        visible = os.environ["HABANA_VISIBLE_MODULES"].split(",")
        assert local_rank < len(visible), """There is not enough devices
        available for training. Please verify if HABANA_VISIBLE_MODULES
        is set correctly."""  # Habana's text, line breaks included
        os.environ["HLS_MODULE_ID"] = visible[local_rank]
        return
    os.environ["HLS_MODULE_ID"] = str(local_rank)


def _setup_environment_from_mpi():
    if all(name in os.environ for name in _MPI.values()):
        return
    if all(name in os.environ for name in _MPI):
        for mpi_name, name in _MPI.items():
            os.environ[name] = os.environ[mpi_name]
    if os.getenv("MASTER_ADDR") is None:
        os.environ["MASTER_ADDR"] = "localhost"
    if os.getenv("MASTER_PORT") is None:
        os.environ["MASTER_PORT"] = "12345"


@_recorded
def initialize_distributed_hpu(world_size=None, rank=None, local_rank=None):
    if all(v is not None for v in (world_size, rank, local_rank)):
        os.environ["WORLD_SIZE"], os.environ["RANK"], os.environ["LOCAL_RANK"] = (
            str(world_size), str(rank), str(local_rank))
    else:
        _setup_environment_from_mpi()
    world_size = int(os.getenv("WORLD_SIZE", 1))
    rank = int(os.getenv("RANK", -1))
    local_rank = int(os.environ.get("LOCAL_RANK", -1))
    _setup_module_id(local_rank=local_rank, world_size=world_size)
    if rank != -1:
        os.environ["ID"] = str(rank)
    return world_size, rank, local_rank


initialize_distributed_hpu()


def _register():
    import torch.distributed as dist
    from hpu_nb.emulator.hpu_device import hccl

    if dist.is_available():
        _STATE.originals.setdefault("hccl registered before", "hccl" in dist.Backend.backend_list)
        hccl.register()


_register()

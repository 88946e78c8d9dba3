"""habana_frameworks.torch.distributed.hccl, emulated: the "hccl" process-group backend for `hpu` tensors.

As Habana's module does on import, it registers "hccl" for the hpu device and initialises the distributed
environment: ranks from a launcher's (or Open MPI's) variables, MASTER_ADDR / MASTER_PORT defaulted to localhost /
12345 when unset (so jobs sharing a machine must each set their own MASTER_PORT), ID and HLS_MODULE_ID (the card of
this local rank, from HABANA_VISIBLE_MODULES when set). Collectives run over gloo on the same host memory.
"""

from __future__ import annotations

import os

import habana_frameworks.torch.hpu  # noqa: F401  (the device first)

from hpu_nb.emulator.hpu_device import hccl as _hccl

__emulated__ = True
# Ray's switch (ray._private.accelerators.hpu) that leaves HABANA_VISIBLE_MODULES as the node has it.
RAY_NOSET_VISIBLE_MODULES = "RAY_EXPERIMENTAL_NOSET_HABANA_VISIBLE_MODULES"
_MPI_NAMES = {"OMPI_COMM_WORLD_LOCAL_RANK": "LOCAL_RANK", "OMPI_COMM_WORLD_SIZE": "WORLD_SIZE",
              "OMPI_COMM_WORLD_RANK": "RANK"}


def _environment_from_launcher() -> None:
    if not all(name in os.environ for name in _MPI_NAMES.values()) and all(name in os.environ for name in _MPI_NAMES):
        for mpi_name, name in _MPI_NAMES.items():
            os.environ[name] = os.environ[mpi_name]
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "12345")


# Habana's assertion, word for word with its line breaks (hccl/__init__.py `_setup_module_id`): scripts and tests
# compare the text (lightning-habana's multi-tenancy test looks for it in a failed tenant's error)
HABANA_NOT_ENOUGH_DEVICES = """There is not enough devices
        available for training. Please verify if HABANA_VISIBLE_MODULES
        is set correctly."""


def _module_id(local_rank: int, world_size: int) -> None:
    if "HLS_MODULE_ID" in os.environ or local_rank == -1 or world_size == 1:
        return
    visible = os.environ.get("HABANA_VISIBLE_MODULES")
    if visible is not None:
        modules = visible.split(",")
        if local_rank >= len(modules):
            # Habana's bridge asserts the same (local rank N binds the Nth visible module). Ray is where users meet it:
            # its HPU accelerator manager narrows each worker's HABANA_VISIBLE_MODULES to that worker's own card.
            raise AssertionError(
                f"{HABANA_NOT_ENOUGH_DEVICES} (hpu_nb: local rank {local_rank} but HABANA_VISIBLE_MODULES={visible!r}."
                f" Under Ray, which sets each worker's HABANA_VISIBLE_MODULES to its own card only, start Ray with"
                f" {RAY_NOSET_VISIBLE_MODULES}=1 in its environment (as Habana's software needs it too): every"
                " worker then sees the node's cards and local rank N takes the Nth.)"
            )
        os.environ["HLS_MODULE_ID"] = modules[local_rank]
    else:
        os.environ["HLS_MODULE_ID"] = str(local_rank)


def initialize_distributed_hpu(world_size: int | None = None, rank: int | None = None,
                               local_rank: int | None = None) -> tuple[int, int, int]:
    """(world_size, rank, local_rank): the arguments when all are given (and exported), else the environment's."""
    if world_size is not None and rank is not None and local_rank is not None:
        os.environ["WORLD_SIZE"], os.environ["RANK"], os.environ["LOCAL_RANK"] = (
            str(world_size), str(rank), str(local_rank))
    else:
        _environment_from_launcher()
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", -1))
    local_rank = int(os.environ.get("LOCAL_RANK", -1))
    _module_id(local_rank, world_size)
    if rank != -1:
        os.environ["ID"] = str(rank)
    return world_size, rank, local_rank


_hccl.register()
initialize_distributed_hpu()

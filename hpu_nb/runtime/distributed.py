"""The device side of multi-process training: HCCL, on a Gaudi and on the emulated Gaudi alike.

Lightning's strategies (hpu_nb/core/strategies) call these few functions and never touch habana_frameworks:
- `initialize_distributed(world_size, rank, local_rank)` before `torch.distributed.init_process_group`: imports
  `habana_frameworks.torch.distributed.hccl` (which registers the "hccl" backend for the hpu device) and calls
  `initialize_distributed_hpu`, which exports WORLD_SIZE / RANK / LOCAL_RANK and picks this process's card from
  HABANA_VISIBLE_MODULES (multi-tenancy). On the emulated Gaudi, HCCL's collectives run over gloo.
- `check_fork_allowed()` around a fork (multi-device training from a notebook).
- `deepspeed_environment()`: what DeepSpeed needs in the environment before it is imported.
"""

from __future__ import annotations

import importlib
import os
import sys

from hpu_nb.runtime import get_backend

HCCL_MODULE = "habana_frameworks.torch.distributed.hccl"
HPU_MODULE = "habana_frameworks.torch.hpu"
VISIBLE_MODULES_ENV = "HABANA_VISIBLE_MODULES"


class ForkAfterDeviceInitError(RuntimeError):
    """A Gaudi whose runtime is already open in this process cannot be shared with forked workers."""


def process_group_backend() -> str:
    """The torch.distributed backend: "hccl" (on the emulated Gaudi, HCCL's semantics over gloo)."""
    return get_backend().dist_backend


def visible_modules() -> list[str]:
    """The card (module) ids listed in HABANA_VISIBLE_MODULES, e.g. "0,1,2,3" -> ["0", "1", "2", "3"]."""
    return [m.strip() for m in os.environ.get(VISIBLE_MODULES_ENV, "").split(",") if m.strip()]


def initialize_distributed(world_size: int, rank: int, local_rank: int, local_world_size: int | None = None) -> str:
    """Get this process ready to join a process group; returns the torch.distributed backend name to use.

    On a Gaudi the order matters: HCCL must be imported (it registers the "hccl" backend) and
    `initialize_distributed_hpu` called (it binds the process to its card) before `init_process_group`.
    """
    backend = get_backend()
    modules = visible_modules()
    if modules and local_world_size is not None and local_world_size > len(modules):
        raise RuntimeError(
            f"{VISIBLE_MODULES_ENV}={os.environ[VISIBLE_MODULES_ENV]!r} lets this tenant use {len(modules)} Gaudi"
            f" card(s), but {local_world_size} processes per node were asked for. Use devices={len(modules)} or list"
            " more modules (and give every tenant its own MASTER_PORT)."
        )
    hccl = importlib.import_module(HCCL_MODULE)
    hccl.initialize_distributed_hpu(world_size=world_size, rank=rank, local_rank=local_rank)
    return backend.dist_backend


def device_runtime_initialized() -> bool:
    """Whether this process has opened the Gaudi runtime (a forked child could not use it).

    Habana's `hpu.is_initialized()` answers when it exists; without it, a loaded Habana bridge counts as open,
    because we cannot prove otherwise and a fork after it hangs or crashes the workers. The emulated card can be
    forked: each forked worker starts with a fresh, empty card.
    """
    backend = get_backend()
    if backend.is_emulated:
        return False
    hthpu = sys.modules.get(HPU_MODULE)
    is_initialized = getattr(hthpu, "is_initialized", None)
    if callable(is_initialized):
        return bool(is_initialized())
    return "habana_frameworks.torch" in sys.modules


def autograd_survives_fork() -> bool:
    """Whether a forked child of this process can run a backward pass.

    torch's autograd engine refuses to run in a child forked after it started its device threads, which it does at the
    first backward pass once a device such as `hpu` is registered (with hpu_nb installed, from `import torch` on). A
    short-lived forked probe answers without touching this process.
    """
    import torch

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the probe child
        ok = b"0"
        try:
            x = torch.zeros(1, requires_grad=True)
            (x * 2).sum().backward()
            ok = b"1"
        finally:
            os.write(write, ok)
            os._exit(0)
    os.close(write)
    try:
        answer = os.read(read, 1)
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    return answer == b"1"


def check_fork_allowed() -> None:
    """Refuse to fork workers that would inherit an open Gaudi runtime, or that could not run autograd, with the
    reason and the way out."""
    if not autograd_survives_fork():
        raise ForkAfterDeviceInitError(
            "Multi-device training from a notebook forks one worker per card, but this kernel has already run a"
            " backward pass, and torch's autograd cannot run in a process forked after that. Run the multi-card"
            " training before any single-card training in the kernel (or restart the kernel), or run it as a script"
            " (%%writefile train.py, then `!python train.py`)."
        )
    if device_runtime_initialized():
        raise ForkAfterDeviceInitError(
            "Multi-device training from a notebook forks one worker per Gaudi card, but this kernel has already"
            " initialised the Gaudi runtime (habana_frameworks), and a forked worker cannot use a device runtime it"
            " inherited. Run the training as a script instead (e.g. write it with %%writefile train.py and run"
            " `!python train.py`; Lightning then starts one process per card), or restart the kernel and create the"
            " multi-device Trainer before anything touches the HPU."
        )


def deepspeed_environment() -> dict[str, str]:
    """Environment DeepSpeed needs before it is imported: its HPU accelerator (on the emulated Gaudi too, which
    provides the habana_frameworks API that accelerator drives)."""
    return {"DEEPSPEED_USE_HPU": "true", "PT_HPU_LAZY_ACC_PAR_MODE": "0", "DS_ACCELERATOR": "hpu"}


def prepare_deepspeed_environment() -> dict[str, str]:
    """Set `deepspeed_environment()` where the user has not set it already; returns what is in effect."""
    wanted = deepspeed_environment()
    for key, value in wanted.items():
        os.environ.setdefault(key, value)
    return {key: os.environ[key] for key in wanted}


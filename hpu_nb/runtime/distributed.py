"""The device side of multi-process training: HCCL, on a Gaudi and on the emulated Gaudi alike.

Lightning's strategies (hpu_nb/core/strategies) call these few functions and never touch habana_frameworks:
- `initialize_distributed(world_size, rank, local_rank)` before `torch.distributed.init_process_group`: imports
  `habana_frameworks.torch.distributed.hccl` (which registers the "hccl" backend for the hpu device) and calls
  `initialize_distributed_hpu`, which exports WORLD_SIZE / RANK / LOCAL_RANK and picks this process's card from
  HABANA_VISIBLE_MODULES (multi-tenancy). On the emulated Gaudi, HCCL's collectives run over gloo.
- `check_fork_allowed()` around a fork (multi-device training from a notebook): a forked worker cannot use a card
  its parent acquired, and the backend knows whether this process holds one.
- `release_habana_default_port()` before launching: importing Habana's HCCL sets MASTER_PORT=12345 when unset; a
  launcher must choose its own free port instead, or jobs sharing a machine collide.
- `deepspeed_environment()`: what DeepSpeed needs in the environment before it is imported.
"""

from __future__ import annotations

import importlib
import os
import sys

from hpu_nb.runtime import get_backend
from hpu_nb.runtime.env import VISIBLE_MODULES_ENV, visible_modules

HCCL_MODULE = "habana_frameworks.torch.distributed.hccl"


class ForkAfterDeviceInitError(RuntimeError):
    """A Gaudi whose runtime is already open in this process cannot be shared with forked workers."""


def process_group_backend() -> str:
    """The torch.distributed backend: "hccl" (on the emulated Gaudi, HCCL's semantics over gloo)."""
    return get_backend().dist_backend


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


def check_fork_allowed() -> None:
    """Refuse to fork workers that would inherit a card this process acquired, with the reason and the way out."""
    allowed, reason = get_backend().can_fork_workers()
    if not allowed:
        raise ForkAfterDeviceInitError(
            f"Multi-device training from a notebook forks one worker per Gaudi card, but {reason}. Something in this"
            " kernel used the device before the Trainer started (an hpu tensor, torch.hpu.get_device_name(),"
            " memory_stats(), ...). Run the training as a script instead (e.g. write it with %%writefile train.py and"
            " run `!python train.py`; Lightning then starts one process per card), or restart the kernel and create"
            " and fit the multi-device Trainer before anything touches the HPU."
        )


# -- MASTER_PORT: Habana's HCCL import defaults it to 12345 -------------------------------------------------------
HCCL_DEFAULT_PORT = "12345"
HCCL_DEFAULT_ADDR = "localhost"


def _initial_environment() -> dict[str, str] | None:
    """The environment this process was started with (Linux keeps it in /proc/self/environ), or None."""
    try:
        raw = open("/proc/self/environ", "rb").read()  # noqa: SIM115 - a short read of a virtual file
    except OSError:
        return None
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in pairs}


def master_port_is_habana_default() -> bool:
    """Whether MASTER_PORT is the 12345 that importing Habana's HCCL module sets when it is unset.

    It is, when it reads 12345 but was not in the environment this process started with (a launcher, torchrun or the
    user's shell sets it there; a job that means 12345 on purpose can export it before starting Python).
    """
    if os.environ.get("MASTER_PORT") != HCCL_DEFAULT_PORT:
        return False
    initial = _initial_environment()
    return initial is not None and "MASTER_PORT" not in initial


def release_habana_default_port() -> bool:
    """Forget a MASTER_PORT (and MASTER_ADDR) that only Habana's import set, so the launcher picks a free port.

    Called by the HPU strategies before they launch workers: otherwise every job on the machine meets on 12345.
    Returns whether anything was removed.
    """
    if not master_port_is_habana_default():
        return False
    os.environ.pop("MASTER_PORT", None)
    initial = _initial_environment() or {}
    if os.environ.get("MASTER_ADDR") == HCCL_DEFAULT_ADDR and "MASTER_ADDR" not in initial:
        os.environ.pop("MASTER_ADDR", None)
    return True


def deepspeed_environment() -> dict[str, str]:
    """Environment DeepSpeed needs before it is imported: its HPU accelerator (on the emulated Gaudi too, which
    provides the habana_frameworks API that accelerator drives)."""
    return {"DEEPSPEED_USE_HPU": "true", "PT_HPU_LAZY_ACC_PAR_MODE": "0", "DS_ACCELERATOR": "hpu"}


def use_environments_ninja() -> None:
    """Put this Python environment's `ninja` (the pip package DeepSpeed depends on) first on PATH, where torch's
    extension builder looks for it, so the build at set-up and the load at fit time run the same ninja.

    Measured (issue 39): `make setup` ran the system's ninja 1.11 (the venv's bin is not on make's PATH), which writes a
    version-5 `.ninja_log`; a notebook kernel (its PATH starts with the venv's bin) ran pip's ninja 1.13, which calls
    that log "too old; starting over", deletes it and compiles DeepSpeed's CPU Adam again, for minutes, mid-fit.
    """
    bin_dir = _environments_ninja_dir()
    if bin_dir is None:
        return
    path = os.environ.get("PATH", "")
    if path.split(os.pathsep)[0] != bin_dir:
        os.environ["PATH"] = os.pathsep.join([bin_dir, *(p for p in path.split(os.pathsep) if p and p != bin_dir)])


def _environments_ninja_dir() -> str | None:
    """The folder of the `ninja` this environment's packages bring: beside this Python, else where the installed
    `ninja` distribution put its program (a venv whose packages come from another environment, through a `.pth` or
    --system-site-packages: its own bin has no ninja, and the system's one, first on PATH after it, is another
    version that discards the other's .ninja_log and so would compile the op built ahead again)."""
    bin_dir = os.path.dirname(sys.executable)
    if os.path.isfile(os.path.join(bin_dir, "ninja")):
        return bin_dir
    import importlib.metadata  # noqa: PLC0415 -- only when this Python's own bin has no ninja

    try:
        files = importlib.metadata.distribution("ninja").files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name == "ninja" and file.parent.name == "bin":
            program = os.path.abspath(str(file.locate()))
            if os.path.isfile(program) and os.access(program, os.X_OK):
                return os.path.dirname(program)
    return None


def prepare_deepspeed_environment() -> dict[str, str]:
    """Set `deepspeed_environment()` where the user has not set it already; returns what is in effect.

    DeepSpeed's compiled ops go where `make setup` built them (the environment's own folder), not into the per-user
    default that every checkout and venv would share and rebuild for each other, whoever started this process.
    """
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))
    use_environments_ninja()
    wanted = deepspeed_environment()
    for key, value in wanted.items():
        os.environ.setdefault(key, value)
    return {key: os.environ[key] for key in wanted}


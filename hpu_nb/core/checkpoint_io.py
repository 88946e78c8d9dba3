"""HPUCheckpointIO: checkpoints saved from device memory to CPU tensors, written atomically, loaded back onto the
device.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Optional

import torch
from lightning.fabric.utilities.apply_func import apply_to_collection
from lightning.fabric.utilities.cloud_io import _atomic_save, get_filesystem
from lightning.fabric.utilities.cloud_io import _load as pl_load
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io.torch_plugin import TorchCheckpointIO

from hpu_nb.runtime import get_backend


class HPUCheckpointIO(TorchCheckpointIO):
    """Saves with CPU tensors (loadable anywhere) and never leaves a half-written file in place of the old one."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Optional[Any] = None) -> None:
        if storage_options is not None:
            raise TypeError(
                f"HPUCheckpointIO does not support `storage_options` (got {storage_options!r}): it writes local or "
                f"fsspec"
                " paths as they are. Drop the argument, or pass your own CheckpointIO plugin that understands it."
            )
        checkpoint = apply_to_collection(checkpoint, torch.Tensor, _to_cpu)
        fs = get_filesystem(path)
        if not _is_local(fs):
            fs.makedirs(os.path.dirname(str(path)), exist_ok=True)
            _atomic_save(checkpoint, path)  # remote stores: Lightning's transaction-based save
            return
        _atomic_local_save(checkpoint, os.fspath(path))

    def load_checkpoint(
        self,
        path: _PATH,
        map_location: Optional[Any] = None,
        weights_only: Optional[bool] = None,
    ) -> dict[str, Any]:
        """Load a checkpoint; tensors land on this process's HPU unless `map_location` says otherwise."""
        fs = get_filesystem(path)
        if not fs.exists(path):
            raise FileNotFoundError(f"Checkpoint file not found: {path}")
        if map_location is None:
            map_location = get_backend().root_device()
        return pl_load(path, map_location=map_location, weights_only=weights_only)


def _is_local(fs: Any) -> bool:
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return "file" in protocols or "local" in protocols


def _to_cpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().cpu() if tensor.device.type != "cpu" else tensor


def _atomic_local_save(checkpoint: dict[str, Any], path: str) -> None:
    """Write to a temporary file beside `path`, fsync it, then rename over `path` (atomic on POSIX)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp_path = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(checkpoint, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        if os.path.exists(tmp_path):
            os.unlink(tmp_path)
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)



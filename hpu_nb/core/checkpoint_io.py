"""HPUCheckpointIO: checkpoints saved from device memory to CPU tensors, written atomically, loaded back onto the
device.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import socket
import tempfile
import zipfile
from collections.abc import Iterator
from typing import Any

import psutil
import torch
from lightning.fabric.utilities.apply_func import apply_to_collection
from lightning.fabric.utilities.cloud_io import _atomic_save, get_filesystem
from lightning.fabric.utilities.cloud_io import _load as pl_load
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io.torch_plugin import TorchCheckpointIO
from typing_extensions import override

from hpu_nb.runtime import get_backend
from hpu_nb.runtime.files import check_named_file, process_umask

__all__ = ["HPUCheckpointIO", "InvalidCheckpointError"]


class HPUCheckpointIO(TorchCheckpointIO):
    """Saves with CPU tensors (loadable anywhere) and never leaves a half-written file in place of the old one."""

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(
                f"HPUCheckpointIO does not support `storage_options` (got {storage_options!r}): it writes local or "
                f"fsspec"
                " paths as they are. Drop the argument, or pass your own CheckpointIO plugin that understands it."
            )
        checkpoint = apply_to_collection(checkpoint, torch.Tensor, _to_cpu)
        fs = get_filesystem(path)
        with _interrupts_surface():
            if not _is_local(fs):
                fs.makedirs(os.path.dirname(str(path)), exist_ok=True)
                _atomic_save(checkpoint, path)  # remote stores: Lightning's transaction-based save
                return
            _atomic_local_save(checkpoint, os.fspath(path))

    @override
    def load_checkpoint(
        self,
        path: _PATH,
        map_location: Any | None = None,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """Load a checkpoint; tensors land on this process's HPU unless `map_location` says otherwise."""
        fs = get_filesystem(path)
        if not fs.exists(path):
            raise FileNotFoundError(f"Checkpoint file not found: {path}")
        if _is_local(fs):
            # A FIFO blocked the open for ever and /dev/zero (size 0) passed for an empty checkpoint: what is not a
            # regular file is named for what it is (the runtime's check, which never blocks). A folder goes on to
            # torch's own error, as before.
            check_named_file(_local_path(path), "checkpoint", directory_ok=True)
        if map_location is None:
            map_location = get_backend().root_device()
        if weights_only is None and _is_url(path):
            # Lightning's `_load` turns weights_only=None into False for http(s) URLs (it would unpickle anything the
            # server sends, running its code); torch's own default for files is True. A URL gets the files' rule: the
            # same weights_only refusal for a pickle that needs more. weights_only=False stays the caller's choice.
            weights_only = True
        try:
            checkpoint: dict[str, Any] = pl_load(path, map_location=map_location, weights_only=weights_only)
            return checkpoint
        except Exception as err:
            problem = _unreadable_reason(fs, path, err) if _is_local(fs) else None
            if problem is None:
                raise
            raise InvalidCheckpointError(f"Cannot load the checkpoint {path}: {problem}") from err


class InvalidCheckpointError(RuntimeError):
    """A checkpoint file that is empty, cut short or not a PyTorch checkpoint at all."""


_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format since torch 1.6
_PICKLE_PROTO = b"\x80"  # the legacy format starts with a pickled magic number


def _unreadable_reason(fs: Any, path: _PATH, err: BaseException) -> str | None:
    """Why a local checkpoint file cannot be a checkpoint, from its bytes; None when it looks like one.

    Only called after torch.load failed: a file that looks right keeps torch's own error (e.g. its advice about
    `weights_only` for a checkpoint holding custom classes, which is the right advice there).
    """
    size = fs.size(path)
    with fs.open(path, "rb") as handle:
        head = handle.read(4)
    if size == 0:
        return (
            "the file is empty (0 bytes): its save never completed (a crash, a full disk, or a copy that failed)."
            " Use an earlier checkpoint, or train again."
        )
    if head.startswith(_ZIP_MAGIC):
        if not zipfile.is_zipfile(os.fspath(path)):
            return (
                f"the file ({size:,} bytes) is a PyTorch checkpoint cut short or corrupted (its zip directory is"
                " missing): it was not written completely, or was damaged in a copy. Use an earlier checkpoint."
            )
        return None
    if head.startswith(_PICKLE_PROTO):
        if isinstance(err, EOFError) or "unexpected EOF" in str(err):  # the file ended before the data did
            return (
                f"the file ({size:,} bytes) is a PyTorch checkpoint in the legacy (pre-zip) format, cut short: it was"
                " not written completely, or was damaged in a copy. Use an earlier checkpoint."
            )
        return None
    return (
        f"the file ({size:,} bytes, first bytes {head!r}) is not a PyTorch checkpoint: torch.save writes a zip"
        " archive. Check the path; if it is a checkpoint, it was overwritten or damaged."
    )


def _is_url(path: _PATH) -> bool:
    """What Lightning's `_load` sends to torch.hub with weights_only=False by default (its own test, kept in step by
    tests/core/test_lightning_tripwire.py)."""
    return isinstance(path, (str, os.PathLike)) and str(path).startswith("http")


def _local_path(path: _PATH) -> str:
    """A local checkpoint's path without fsspec's protocol (file:///x is /x)."""
    text = os.fspath(path)
    for prefix in ("file://", "local://"):
        if text.startswith(prefix):
            return text[len(prefix):]
    return text


def _is_local(fs: Any) -> bool:
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return "file" in protocols or "local" in protocols


def _to_cpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().cpu() if tensor.device.type != "cpu" else tensor


@contextlib.contextmanager
def _interrupts_surface() -> Iterator[None]:
    """A Ctrl-C (or SystemExit) that lands while torch.save writes stays what it is.

    torch.save's zip writer calls the file's `write` from C++; an interrupt raised there unwinds through it, and the
    writer's `__exit__` then still writes the zip's end record at a position it no longer trusts, raising
    `RuntimeError: [enforce fail at inline_container.cc] . unexpected pos`, which replaces the KeyboardInterrupt (kept
    only as its `__context__`). Re-raise the interrupt itself, as an interrupt anywhere else in a run surfaces.
    """
    try:
        yield
    except Exception as err:
        interrupt = _interrupt_in(err)
        if interrupt is None:
            raise
        raise interrupt from None


def _interrupt_in(err: BaseException) -> BaseException | None:
    """The KeyboardInterrupt / SystemExit among the exceptions `err` replaced, if any."""
    seen: set[int] = set()
    current: BaseException | None = err.__cause__ or err.__context__
    while current is not None and id(current) not in seen:
        if isinstance(current, (KeyboardInterrupt, SystemExit)):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _atomic_local_save(checkpoint: dict[str, Any], path: str) -> None:
    """Write to a temporary file beside `path`, fsync it, then rename over `path` (atomic on POSIX).

    The temporary file is named after this host and process (`.<name>.<host>-<pid>.<random>.tmp`), so the next save
    into the same folder can remove what a crashed (killed) saver left behind, whatever checkpoint it was writing
    (ModelCheckpoint's epoch / step names never repeat), without touching a live one's file. The file gets the mode
    `torch.save` would give it (the user's umask), not mkstemp's 0600: teammates read checkpoints in shared folders.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    base = os.path.basename(path)
    _remove_stale_temp_files(directory)
    fd, tmp_path = tempfile.mkstemp(prefix=f".{base}.{_HOST}-{os.getpid()}.", suffix=".tmp", dir=directory)
    _WRITING.add(tmp_path)
    try:
        os.fchmod(fd, 0o666 & ~process_umask())
        try:
            with os.fdopen(fd, "wb") as handle:  # closing flushes: a full disk can fail there too
                torch.save(checkpoint, handle)
                handle.flush()
                os.fsync(handle.fileno())
        except Exception as err:
            os_error = _os_error_in(err)
            if os_error is None:
                raise
            raise _write_error(path, directory, os_error) from err
        os.replace(tmp_path, path)
    except BaseException:
        if os.path.exists(tmp_path):
            os.unlink(tmp_path)
        raise
    finally:
        _WRITING.discard(tmp_path)
    try:  # make the rename itself durable
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


_WRITING: set[str] = set()  # temporary files this process is writing now (saves may run in a thread)
_HOST = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"


def _remove_stale_temp_files(directory: str) -> None:
    """Delete our temporary files in `directory` whose saving process (on this host) no longer exists: a crash
    mid-save. Only ours: by the name pattern above and a dead owner pid."""
    pattern = re.compile(rf"^\..+\.{re.escape(_HOST)}-(\d+)\.[A-Za-z0-9_]+\.tmp$")
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        match = pattern.match(name)
        full = os.path.join(directory, name)
        if match is None or full in _WRITING or _process_exists(int(match.group(1))):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(full)


def _process_exists(pid: int) -> bool:
    if pid == os.getpid():
        return False  # ours and not in _WRITING: left by an earlier save of this process that was interrupted
    return psutil.pid_exists(pid)


def _os_error_in(err: BaseException) -> OSError | None:
    """The OSError behind a failed write: itself, or the one torch's writer hit and replaced with its own message."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _write_error(path: str, directory: str, err: OSError) -> OSError:
    """An OSError that names the checkpoint, the disk and its free space, and says the previous checkpoint is intact."""
    mount = _mount_point(directory)
    try:
        usage = shutil.disk_usage(directory)
        space = f"{_fmt_bytes(usage.free)} free of {_fmt_bytes(usage.total)}"
    except OSError:
        space = "free space unknown"
    reason = "the disk is full" if err.errno == errno.ENOSPC else (err.strerror or str(err))
    return OSError(
        err.errno,
        f"Could not write the checkpoint {path}: {reason} (disk mounted at {mount}, {space})."
        " Nothing was replaced: the previous checkpoint at that path, if any, is intact. Free some space on that disk"
        " or save to another one (e.g. Trainer(default_root_dir=...) or ModelCheckpoint(dirpath=...)).",
    )


def _mount_point(directory: str) -> str:
    path = os.path.realpath(directory)
    while not os.path.ismount(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover

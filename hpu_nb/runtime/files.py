"""Reading the small files users name (op lists, fp8 configs and measurements, DeepSpeed configs) safely, and writing
small files so that no reader ever sees half of one.

A path in an environment variable or an argument may name anything: `/dev/zero` (read forever: the kernel's OOM killer
ended the first probe at 22 GB), a FIFO (blocks forever), a folder, or a huge file. `read_small_file` reads only a
regular file, at most `limit` bytes, and never blocks on opening (O_NONBLOCK: a FIFO with no writer is refused, not
waited on). Its error names the file and what it is.

`write_file_atomically` is the one way hpu_nb writes a small file others may read at the same moment (ranks starting
together, a quantize reading what a measure wrote): a temporary beside it (`write_temporary_beside`, also for writers
that rename several at once), renamed over it.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

SMALL_FILE_LIMIT = 64 << 20  # op lists and JSON configs are kilobytes; measurements of a big model, a few MB


class UnreadableFileError(OSError):
    """The named file cannot be what was asked for (not a regular file, too large, unreadable): the message says."""


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _open_named(path: str | os.PathLike[str], what: str, *, directory_ok: bool = False) -> tuple[int, os.stat_result]:
    """(a descriptor, its stat) for `path` if it is a regular file (or, with directory_ok, a directory), opened without
    blocking (O_NONBLOCK: a FIFO with no writer is refused, not waited on); UnreadableFileError naming `what` else."""
    p = Path(path).expanduser()
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UnreadableFileError(f"{what} {str(path)!r} does not exist (resolved to {p.resolve()}).") from None
    except OSError as err:
        raise UnreadableFileError(f"{what} {str(path)!r} cannot be read: {err.strerror or err}.") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            if directory_ok:
                return fd, info
            raise UnreadableFileError(f"{what} {str(path)!r} is a directory: name a file.")
        if not stat.S_ISREG(info.st_mode):
            raise UnreadableFileError(f"{what} {str(path)!r} is not a regular file (a device or a pipe): it is"
                                      f" {_kind(info.st_mode)}.")
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def check_named_file(path: str | os.PathLike[str], what: str, *, directory_ok: bool = False) -> os.stat_result:
    """The stat of `path` when it is a regular file (or, with directory_ok, a directory), checked without blocking
    or reading; UnreadableFileError naming `what` and the file else. For files too big for read_small_file (a
    checkpoint): check here, then open it for reading."""
    fd, info = _open_named(path, what, directory_ok=directory_ok)
    os.close(fd)
    return info


def read_small_file(path: str | os.PathLike[str], what: str, limit: int = SMALL_FILE_LIMIT) -> bytes:
    """The bytes of the regular file `path` (at most `limit`); UnreadableFileError, naming `what` and the file, else."""
    fd, info = _open_named(path, what)
    try:
        if info.st_size > limit:
            raise UnreadableFileError(f"{what} {str(path)!r} is {info.st_size:,} bytes; a {what} is at most"
                                      f" {limit:,} bytes.")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(limit + 1)  # a file growing while read is cut here, not followed
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UnreadableFileError(f"{what} {str(path)!r} grew past {limit:,} bytes while being read.")
    return data


def process_umask() -> int:
    """This process's umask, read without changing it (os.umask would, for every thread, for a moment)."""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_temporary_beside(path: str | os.PathLike[str], data: bytes | str) -> Path:
    """Write `data` (str: UTF-8) to a new temporary file beside `path` and return it, for the caller to rename over
    `path` (atomic within one folder); a failed write leaves nothing. The name is mkstemp's, which no other process or
    thread takes; the mode is what a plain `open(path, "w")` would give (the user's umask), not mkstemp's 0600, as
    teammates read these files in shared folders."""
    target = Path(path)
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        os.fchmod(handle, 0o666 & ~process_umask())
        with os.fdopen(handle, "wb") as out:
            out.write(data.encode("utf-8") if isinstance(data, str) else data)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    return Path(temporary)


def write_file_atomically(path: str | os.PathLike[str], data: bytes | str) -> None:
    """Write `data` (str: UTF-8) to `path` so that a reader sees the old file or the whole new one, never part of it,
    and a failed write (a full disk) leaves neither a partial file nor its temporary (`write_temporary_beside`,
    renamed over `path`)."""
    temporary = write_temporary_beside(path, data)
    try:
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise

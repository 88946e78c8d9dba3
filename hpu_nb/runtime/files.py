"""Reading the small files users name (op lists, fp8 configs and measurements, DeepSpeed configs) safely.

A path in an environment variable or an argument may name anything: `/dev/zero` (read forever: the kernel's OOM killer
ended the first probe at 22 GB), a FIFO (blocks forever), a folder, or a huge file. `read_small_file` reads only a
regular file, at most `limit` bytes, and never blocks on opening (O_NONBLOCK: a FIFO with no writer is refused, not
waited on). Its error names the file and what it is.
"""

from __future__ import annotations

import os
import stat
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

"""Autocast operator lists: which ATen ops run in the lower precision and which stay fp32, as Habana's bridge does it.

On a Gaudi the lists are files named by environment variables, read when Habana's software loads (at `import torch`
since 1.18): PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST / PT_HPU_AUTOCAST_FP32_OPS_LIST from 1.19, LOWER_LIST / FP32_LIST
before (hpu_nb.runtime.generations says which a release reads). A file **replaces** that default list; the lower list
wins over the fp32 list. The emulated Gaudi's device applies the same lists with the same rules (its AutocastHPU
kernels), so what a list does here is what it does on a Gaudi.

`HPUPrecisionPlugin(lower_list=..., fp32_list=...)` validates the lists (file, line and op in every error) and
`apply_op_lists` makes them the ones in force: it sets the variables the installed release reads (processes started
from now on read them) and asks the device to load them. The emulated card loads them at once; a Gaudi cannot (Habana
read the files when it loaded), so there the variables must be set before Python starts, and the plugin says so
rather than training rank 0 and the other ranks with different lists.

File format (Habana's): one ATen op name per line. hpu_nb also skips blank lines and `#` comments.
"""

from __future__ import annotations

import atexit
import contextlib
import difflib
import functools
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from hpu_nb.runtime import get_backend
from hpu_nb.runtime.files import UnreadableFileError, read_small_file

OpListSource = str | os.PathLike[str] | Iterable[str] | None


class OpListError(ValueError):
    """A bad op list: missing or unreadable file, unknown op, malformed line, or an op in both lists."""


@dataclass(frozen=True)
class OpEntry:
    """One op name and where it was written (a file and line, or the plugin argument it came from)."""

    op: str
    origin: str  # "ops.txt:3" or "lower_list argument [0]"

    def __str__(self) -> str:
        return f"{self.origin}: {self.op!r}"


@dataclass(frozen=True)
class OpLists:
    """The validated lower-precision and fp32 op lists; None for a list that was not given (the default stays)."""

    lower: tuple[OpEntry, ...] | None = None
    fp32: tuple[OpEntry, ...] | None = None
    lower_file: str | None = None  # the file the list was read from, when it came from one
    fp32_file: str | None = None

    @property
    def lower_ops(self) -> frozenset[str]:
        return frozenset(e.op for e in self.lower or ())

    @property
    def fp32_ops(self) -> frozenset[str]:
        return frozenset(e.op for e in self.fp32 or ())

    def __bool__(self) -> bool:
        return self.lower is not None or self.fp32 is not None

    def __repr__(self) -> str:
        parts = [f"{name}={sorted(ops)}" for name, given, ops in
                 (("lower", self.lower, self.lower_ops), ("fp32", self.fp32, self.fp32_ops)) if given is not None]
        return f"OpLists({', '.join(parts)})"


# -- the universe of op names --------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def aten_ops() -> frozenset[str]:
    """ATen op names without overloads: what Habana's op lists name."""
    names = set()
    for qualified in torch._C._dispatch_get_all_op_names():
        ns, _, rest = qualified.partition("::")
        if ns == "aten":
            names.add(rest.split(".", 1)[0])
    return frozenset(names)


def is_known_op(name: str) -> bool:
    return name in aten_ops()


def _unknown_op_message(entry: OpEntry) -> str:
    close = difflib.get_close_matches(entry.op, sorted(aten_ops()), n=3, cutoff=0.75)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return (f"{entry.origin}: unknown op {entry.op!r} (op lists name ATen ops, e.g. 'linear', 'softmax', 'mm');"
            f" kept, but no op will match it, as on a Gaudi.{hint}")


class UnknownOpWarning(UserWarning):
    """An op list names an op that is not an ATen op: on a Gaudi that line is simply never matched."""


_warned_unknown: set[str] = set()  # once per name and process: lists are applied again by every Trainer


def _warn_unknown_ops(entries: Iterable[OpEntry]) -> None:
    for entry in entries:
        if not is_known_op(entry.op) and entry.op not in _warned_unknown:
            _warned_unknown.add(entry.op)
            warnings.warn(_unknown_op_message(entry), UnknownOpWarning, stacklevel=3)


# -- reading -------------------------------------------------------------------------------------------------------
def read_op_file(path: str | os.PathLike[str], *, what: str = "op list") -> tuple[OpEntry, ...]:
    """Op names in a Habana op-list file, each with its file:line; a file that cannot be a list is an error naming
    it."""
    p = Path(path).expanduser()
    try:
        raw = read_small_file(p, f"{what} file")
    except UnreadableFileError as err:
        raise OpListError(str(err)) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise OpListError(f"{what} file {str(path)!r} is not a text file of op names (not UTF-8 text at byte"
                          f" {err.start}); write one ATen op name per line.") from None
    entries = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        if any(ch.isspace() for ch in name) or "," in name:
            raise OpListError(f"{p}:{lineno}: expected one op name per line, got {name!r}.")
        entries.append(OpEntry(name, f"{p}:{lineno}"))
    return tuple(entries)


def _entries(source: OpListSource, *, what: str) -> tuple[tuple[OpEntry, ...] | None, str | None]:
    """(entries, file) of one plugin argument: a file path or op names."""
    if source is None:
        return None, None
    if isinstance(source, (str, os.PathLike)):
        return read_op_file(source, what=what), str(Path(source).expanduser().resolve())
    if isinstance(source, (bytes, bytearray)) or not isinstance(source, Iterable):
        raise OpListError(f"{what}: pass a file path or a list of op names, not {type(source).__name__}.")
    entries = []
    for i, name in enumerate(source):
        if not isinstance(name, str) or not name.strip():
            raise OpListError(f"{what} [{i}]: op names must be non-empty strings, got {name!r}.")
        entries.append(OpEntry(name.strip(), f"{what} [{i}]"))
    return tuple(entries), None


def load_op_lists(lower: OpListSource = None, fp32: OpListSource = None) -> OpLists:
    """Validated op lists from plugin arguments (a file path or op names each); a list not given stays the default."""
    lower_entries, lower_file = _entries(lower, what="lower_list argument")
    fp32_entries, fp32_file = _entries(fp32, what="fp32_list argument")
    _warn_unknown_ops((*(lower_entries or ()), *(fp32_entries or ())))
    problems = []
    first_lower: dict[str, OpEntry] = {}
    for e in lower_entries or ():
        first_lower.setdefault(e.op, e)
    for e in fp32_entries or ():
        if e.op in first_lower:
            problems.append(f"op {e.op!r} is in both lists: {first_lower[e.op].origin} (lower) and {e.origin} (fp32).")
    if problems:
        raise OpListError("Invalid autocast op lists:\n  " + "\n  ".join(problems))
    return OpLists(lower_entries, fp32_entries, lower_file, fp32_file)


# -- applying ------------------------------------------------------------------------------------------------------
_written_dir: str | None = None


def _list_file(entries: tuple[OpEntry, ...], given_file: str | None) -> str:
    """The file to name in the variable: the user's own file when Habana's reader takes it as it is, else one written
    with one name per line (kept until exit, so worker processes started meanwhile can read it).

    Habana reads each line verbatim (`getline`): a comment, a blank line, spaces around a name or a CRLF ending would be
    an op name that never matches, and since the file replaces the whole default list, every default op would silently
    lose autocast. Such a file is handed over as a normalised copy.
    """
    text = "".join(f"{e.op}\n" for e in entries)
    if given_file is not None:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            given = read_small_file(given_file, "op-list file").decode("utf-8")
            if given in (text, text.rstrip("\n")):
                return given_file
    global _written_dir
    if _written_dir is None:
        _written_dir = tempfile.mkdtemp(prefix="hpu_nb_oplists_")
        atexit.register(shutil.rmtree, _written_dir, True)
    path = Path(_written_dir) / f"ops_{abs(hash(text)):x}.txt"
    path.write_text(text, encoding="utf-8")
    return str(path)


def shadowed_fp32_ops(lists: OpLists, lower_in_force: Iterable[str]) -> list[str]:
    """fp32-list ops that the lower-precision list in force also names: Habana checks the lower list first."""
    lower = set(lists.lower_ops) if lists.lower is not None else set(lower_in_force)
    return sorted(op for op in lists.fp32_ops if op in lower)


def apply_op_lists(lists: OpLists) -> tuple[bool, str]:
    """Make `lists` the op lists in force: set the variables the installed release reads and have the device load
    them. Returns (in force in this process, a note for the user)."""
    backend = get_backend()
    lower_env, fp32_env = backend.op_list_envs()
    if lists.lower is not None:
        os.environ[lower_env] = _list_file(lists.lower, lists.lower_file)
    if lists.fp32 is not None:
        os.environ[fp32_env] = _list_file(lists.fp32, lists.fp32_file)
    return backend.load_autocast_lists()

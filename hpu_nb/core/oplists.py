"""Autocast operator lists: which ops run in bf16 (LOWER_LIST) and which stay fp32 (FP32_LIST).

On a Gaudi, Habana's autocast reads the files named in LOWER_LIST / FP32_LIST at process start. CPU autocast
(the emulated Gaudi) has fixed op lists compiled into C++, so we apply the same files with a TorchFunctionMode
that sees each torch function before autocast does: an op in the fp32 list gets float32 inputs and runs with
autocast off, an op in the lower list gets inputs in the autocast dtype. The lists override the backend's
default lists for the named ops only, and act only while autocast is enabled on the backend's device type,
so a local `torch.autocast(..., enabled=False)` block turns them off as well. No lists, no mode: zero overhead.

File format (Habana's): one op name per line; blank lines and `#` comments are ignored.
"""

from __future__ import annotations

import difflib
import functools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Union

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

log = logging.getLogger(__name__)

LOWER_ENV = "LOWER_LIST"
FP32_ENV = "FP32_LIST"

OpListSource = Union[str, os.PathLike, Iterable[str], None]

# Tensor dunder methods and the op names users write for them.
_ALIASES = {
    "__matmul__": "matmul",
    "__rmatmul__": "matmul",
    "__mul__": "mul",
    "__rmul__": "mul",
    "__add__": "add",
    "__radd__": "add",
    "__sub__": "sub",
    "__rsub__": "rsub",
    "__truediv__": "div",
    "__rtruediv__": "div",
    "__pow__": "pow",
    "__rpow__": "pow",
}


class OpListError(ValueError):
    """A bad op list: missing file, unknown op, malformed line, or an op in both lists."""


@dataclass(frozen=True)
class OpEntry:
    """One op name and where it was written (a file and line, or the plugin argument it came from)."""

    op: str
    origin: str  # "ops.txt:3" or "lower_list argument [0]"

    def __str__(self) -> str:
        return f"{self.origin}: {self.op!r}"


@dataclass(frozen=True)
class OpLists:
    """The validated lower-precision and fp32 op names, with where each came from."""

    lower: tuple[OpEntry, ...] = ()
    fp32: tuple[OpEntry, ...] = ()
    from_env: bool = False  # both came from LOWER_LIST / FP32_LIST (applied natively by Habana on a Gaudi)
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def lower_ops(self) -> frozenset[str]:
        return frozenset(e.op for e in self.lower)

    @property
    def fp32_ops(self) -> frozenset[str]:
        return frozenset(e.op for e in self.fp32)

    def __bool__(self) -> bool:
        return bool(self.lower or self.fp32)

    def __repr__(self) -> str:
        return f"OpLists(lower={sorted(self.lower_ops)}, fp32={sorted(self.fp32_ops)})"


# -- the universe of op names ------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def python_level_ops() -> frozenset[str]:
    """Op names callable from Python (torch.X, torch.nn.functional.X, Tensor.X): what the emulated lists can catch."""
    names: set[str] = set()
    for namespace in (torch, torch.nn.functional, torch.Tensor, torch.special, torch.linalg, torch.fft):
        names.update(n for n in dir(namespace) if not n.startswith("_") and callable(getattr(namespace, n, None)))
    names.update(_ALIASES.values())
    return frozenset(n for n in names if n[:1].islower())


@functools.lru_cache(maxsize=1)
def aten_ops() -> frozenset[str]:
    """ATen op names without overloads (what Habana's op lists name)."""
    names = set()
    for qualified in torch._C._dispatch_get_all_op_names():
        ns, _, rest = qualified.partition("::")
        if ns == "aten":
            names.add(rest.split(".", 1)[0])
    return frozenset(names)


def is_known_op(name: str) -> bool:
    return name in python_level_ops() or name in aten_ops()


def _unknown_op_message(entry: OpEntry) -> str:
    close = difflib.get_close_matches(entry.op, sorted(python_level_ops() | aten_ops()), n=3, cutoff=0.75)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return f"{entry.origin}: unknown op {entry.op!r} (not a torch, torch.nn.functional, Tensor or ATen op).{hint}"


# -- reading -------------------------------------------------------------------------------------------------------
def read_op_file(path: str | os.PathLike, *, what: str = "op list") -> tuple[OpEntry, ...]:
    """Op names in a Habana op-list file, each with its file:line; malformed lines are errors naming the line."""
    p = Path(path).expanduser()
    if not p.is_file():
        reason = "is a directory" if p.is_dir() else "does not exist"
        raise OpListError(f"{what} file {str(path)!r} {reason} (resolved to {p.resolve()}).")
    entries = []
    for lineno, raw in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        if any(ch.isspace() for ch in text) or "," in text:
            raise OpListError(f"{p}:{lineno}: expected one op name per line, got {text!r}.")
        entries.append(OpEntry(text, f"{p}:{lineno}"))
    return tuple(entries)


def _entries(source: OpListSource, *, what: str) -> tuple[OpEntry, ...]:
    if source is None:
        return ()
    if isinstance(source, (str, os.PathLike)):
        return read_op_file(source, what=what)
    entries = []
    for i, name in enumerate(source):
        if not isinstance(name, str) or not name.strip():
            raise OpListError(f"{what} [{i}]: op names must be non-empty strings, got {name!r}.")
        entries.append(OpEntry(name.strip(), f"{what} [{i}]"))
    return tuple(entries)


def load_op_lists(
    lower: OpListSource = None,
    fp32: OpListSource = None,
    *,
    env: Mapping[str, str] | None = None,
) -> OpLists:
    """Validated op lists from plugin arguments (file path or names), else from LOWER_LIST / FP32_LIST.

    An argument replaces its environment variable; the other list still comes from the environment.
    """
    env = os.environ if env is None else env
    from_env = lower is None and fp32 is None
    if lower is None and env.get(LOWER_ENV):
        lower_entries = read_op_file(env[LOWER_ENV], what=f"{LOWER_ENV}")
    else:
        lower_entries = _entries(lower, what="lower_list argument")
    if fp32 is None and env.get(FP32_ENV):
        fp32_entries = read_op_file(env[FP32_ENV], what=f"{FP32_ENV}")
    else:
        fp32_entries = _entries(fp32, what="fp32_list argument")

    problems = [_unknown_op_message(e) for e in (*lower_entries, *fp32_entries) if not is_known_op(e.op)]
    first_lower = {}
    for e in lower_entries:
        first_lower.setdefault(e.op, e)
    for e in fp32_entries:
        if e.op in first_lower:
            problems.append(f"op {e.op!r} is in both lists: {first_lower[e.op].origin} (lower) and {e.origin} (fp32).")
    if problems:
        raise OpListError("Invalid autocast op lists:\n  " + "\n  ".join(problems))

    notes = tuple(
        f"{e.origin}: {e.op!r} is an ATen op with no torch-level function; the emulated Gaudi applies op lists to"
        " torch functions, so it has no effect there (a Gaudi applies it)."
        for e in (*lower_entries, *fp32_entries)
        if e.op not in python_level_ops()
    )
    return OpLists(tuple(lower_entries), tuple(fp32_entries), from_env=from_env, notes=notes)


# -- applying ------------------------------------------------------------------------------------------------------
_FP32 = "fp32"
_LOWER = "lower"


def op_name(func: Callable[..., Any]) -> str | None:
    """The op-list name of a torch function ("linear" for F.linear, "matmul" for Tensor.__matmul__)."""
    name = getattr(func, "__name__", None)
    if not isinstance(name, str):
        return None
    return _ALIASES.get(name, name)


def _cast(args: Any, dtype: torch.dtype) -> Any:
    def cast(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != dtype and x.dtype != torch.float64:
            return x.to(dtype)
        return x

    return tree_map(cast, args)


class OpListMode(TorchFunctionMode):
    """While autocast is on for `device_type`, run fp32-list ops in float32 and lower-list ops in the autocast dtype."""

    def __init__(self, lists: OpLists, device_type: str, verbose: bool = False) -> None:
        super().__init__()
        self.device_type = device_type
        self.verbose = verbose
        self._decisions = {op: _FP32 for op in lists.fp32_ops}
        self._decisions.update({op: _LOWER for op in lists.lower_ops})
        self._by_func: dict[Any, str | None] = {}
        self.applied: dict[str, int] = {}  # op -> times forced (for verbose reports and tests)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        try:
            action = self._by_func[func]
        except (KeyError, TypeError):
            action = self._decisions.get(op_name(func) or "")
            try:
                self._by_func[func] = action
            except TypeError:
                pass
        if action is None or not torch.is_autocast_enabled(self.device_type):
            return func(*args, **kwargs)
        dtype = torch.float32 if action == _FP32 else torch.get_autocast_dtype(self.device_type)
        self._note(func, dtype)
        args, kwargs = _cast((args, kwargs), dtype)
        with torch.autocast(self.device_type, enabled=False):
            return func(*args, **kwargs)

    def _note(self, func: Any, dtype: torch.dtype) -> None:
        name = op_name(func) or repr(func)
        count = self.applied.get(name, 0)
        self.applied[name] = count + 1
        if self.verbose and count == 0:
            log.info("autocast op list: %s runs in %s", name, str(dtype).replace("torch.", ""))

"""The plan of a Trainer: the few statements both the generated code and `build()` come from, so they cannot drift.

A plan is a list of `Statement`s (`plugin = HPUPrecisionPlugin(...)`, `model = plugin.convert_modules(model, ...)`,
`trainer = L.Trainer(...)`) whose values are plain data, `Call`s and `Ref`s: hpu_nb.notebook.trainer_config.render
writes them as Python, hpu_nb.notebook.trainer_config.evaluate runs them.
"""

from __future__ import annotations

import datetime
import pathlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# where each name the generated code uses comes from (datetime / pathlib: a timedelta or a path in `extra`)
# names imported from a Lightning module (the loggers the form offers)
FROM_LIGHTNING = {"CSVLogger": "lightning.pytorch.loggers", "TensorBoardLogger": "lightning.pytorch.loggers"}
IMPORTS = {
    "L": "import lightning as L",
    "datetime": "import datetime",
    "pathlib": "import pathlib",
    **{name: f"from {module} import {name}" for name, module in FROM_LIGHTNING.items()},
}
HPU_NB_NAMES = ("HPUAccelerator", "HPUDeepSpeedPrecisionPlugin", "HPUDeepSpeedStrategy", "HPUFSDPPrecision",
                "HPUFSDPStrategy", "HPUPrecisionPlugin", "HPUProfiler", "MemoryMonitor")


@dataclass(frozen=True)
class Ref:
    """A name in the generated code's namespace (`model`, `plugin`) or a dotted attribute of one."""

    name: str


@dataclass(frozen=True)
class Call:
    """`func(*args, **kwargs)`; func is a public name (`L.Trainer`, `HPUPrecisionPlugin`) or a Ref's attribute."""

    func: str
    kwargs: tuple[tuple[str, Any], ...] = ()
    args: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Statement:
    target: str  # "plugin", "model", "trainer"
    value: Any
    comments: tuple[str, ...] = ()  # lines above the statement
    note: str = ""  # what the statement does (a comment line above it)
    arg_notes: tuple[tuple[str, str], ...] = ()  # (keyword, comment above it) in the Trainer call


Plan = list[Statement]


def items(kwargs: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """A Call's keyword arguments from a dict (Calls are frozen, so they hold tuples)."""
    return tuple(kwargs.items())


def public_names(value: Any) -> Iterable[str]:
    """Public names a plan value uses (not namespace variables): each comes with an import line."""
    if isinstance(value, Call):
        head = value.func.split(".")[0]
        if head in IMPORTS or head in HPU_NB_NAMES:
            yield head
        for item in list(value.args) + [v for _, v in value.kwargs]:
            yield from public_names(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from public_names(item)
    elif isinstance(value, dict):
        for item in (*value.keys(), *value.values()):
            yield from public_names(item)
    elif isinstance(value, datetime.timedelta):
        yield "datetime"
    elif isinstance(value, pathlib.PurePath):
        yield "pathlib"


def required_names(plan: Plan) -> list[str]:
    """The public names a plan uses, sorted."""
    return sorted({name for step in plan for name in public_names(step.value)})

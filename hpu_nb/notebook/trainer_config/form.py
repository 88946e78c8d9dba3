"""How a TrainerConfig field appears in the form, written once beside the field itself (its dataclass metadata).

`TrainerConfig` declares each field with `field(default=..., metadata=control(...))`; the widget builds its rows from
`form_fields()` in declaration order, the model reads a field's choices and bounds from the same `Control`, and a
field marked `trainer_argument` goes into `L.Trainer(...)` under its own name. Adding a control to the form is one
field declaration. Plain data: no widget is made here (hpu_nb.notebook.config_widget makes them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["toggle", "dropdown", "int", "check", "text", "oplist"]


@dataclass(frozen=True)
class Control:
    """A field's row: its label, what kind of control, its choices or bounds, and how the code writes it."""

    label: str
    kind: Kind
    options: Sequence[tuple[str, Any]] = ()  # (label, value) of each choice ("toggle", "dropdown")
    text: str = ""  # a checkbox's words; a text field's placeholder
    minimum: int | None = None  # an "int" field's smallest value (the form's own bound; core's rules are core's)
    precision_part: bool = False  # also a row of PrecisionConfigWidget
    trainer_argument: bool = False  # written into L.Trainer(...) as `<field>=<value>`
    note: str = ""  # a comment above that argument in the code

    @property
    def values(self) -> tuple[Any, ...]:
        return tuple(value for _, value in self.options)


def control(label: str, kind: Kind, **kwargs: Any) -> dict[str, Control]:
    """The metadata of a form field: `field(default=..., metadata=control("epochs", "int", minimum=1))`."""
    return {"form": Control(label, kind, **kwargs)}


def form_fields(cls: type, precision_only: bool = False) -> dict[str, Control]:
    """The fields of a config dataclass that have a row in the form, in declaration order."""
    found = {f.name: f.metadata["form"] for f in dataclasses.fields(cls) if "form" in f.metadata}
    return {name: c for name, c in found.items() if c.precision_part or not precision_only}

"""The code of a plan: Python a user can paste that makes the same Trainer as `TrainerConfig.build()`, with the
configuration's errors on top as comments and the snippets (autocast in the LightningModule, ZeRO-Offload's
optimizer) a user pastes into their own class."""

from __future__ import annotations

import datetime
import keyword
import math
import pathlib
from collections.abc import Sequence
from typing import Any

from hpu_nb.core.issues import Issue
from hpu_nb.core.precision_names import autocast_dtype
from hpu_nb.notebook.trainer_config.plan import HPU_NB_NAMES, IMPORTS, Call, Plan, Ref, required_names


class UnrenderableError(ValueError):
    """A value (or keyword) the generated code cannot write as an exact Python literal: refused, never interpolated."""


# pathlib's own classes, by the constructor that makes an equal one (Path() is a PosixPath or a WindowsPath)
_PATH_CLASSES: dict[type, str] = {pathlib.PosixPath: "pathlib.Path", pathlib.WindowsPath: "pathlib.Path",
                 pathlib.PurePosixPath: "pathlib.PurePosixPath", pathlib.PureWindowsPath: "pathlib.PureWindowsPath"}


def keyword_problem(key: Any) -> str | None:
    """Why `key` cannot be a keyword argument in the generated code (None when it can): a str identifier that is not
    a Python keyword. Anything else would be interpolated into the code as text."""
    if not isinstance(key, str):
        return f"a keyword argument name must be a string, not {type(key).__name__}"
    if not key.isidentifier() or keyword.iskeyword(key):
        return "a keyword argument name must be a Python identifier (letters, digits and _) and not a Python keyword"
    return None


def literal_problem(value: Any) -> str | None:
    """Why `value` cannot be written as Python that evaluates back to an equal value (None when it can)."""
    try:
        render_value(value)
    except UnrenderableError as problem:
        return str(problem)
    return None


def render_value(value: Any) -> str:
    """A plan value as Python source that evaluates back to an equal value (NaN: to a NaN), or UnrenderableError.

    Strings, numbers and containers go through their base type's repr (never a subclass's __repr__, never str()),
    so nothing in a value can end a literal; inf / nan become float("inf") / float("nan"); a timedelta and pathlib's
    paths become constructor calls (their imports come with the code: plan.public_names).
    """
    if isinstance(value, Ref):
        return value.name
    if isinstance(value, Call):
        parts = [render_value(a) for a in value.args] + [f"{_keyword(k)}={render_value(v)}" for k, v in value.kwargs]
        return f"{value.func}({', '.join(parts)})"
    if value is None or isinstance(value, bool):
        return "True" if value is True else "False" if value is False else "None"
    if isinstance(value, int):
        try:
            return int.__repr__(value)
        except ValueError as err:  # more digits than sys.get_int_max_str_digits()
            raise UnrenderableError(f"the integer is too long to write ({err})") from err
    if isinstance(value, float):
        if math.isnan(value):
            return 'float("nan")'
        if math.isinf(value):
            return 'float("inf")' if value > 0 else 'float("-inf")'
        return float.__repr__(value)
    if isinstance(value, str):
        text = str.__str__(value)
        if text.isprintable() and '"' not in text and "\\" not in text:
            return f'"{text}"'  # the code's usual style; nothing in it can end or escape the literal
        return str.__repr__(text)  # escapes newline, CR, NUL, quotes and backslashes: the exact string back
    if type(value) is list:
        return "[" + ", ".join(render_value(v) for v in value) + "]"
    if type(value) is tuple:
        inner = [render_value(v) for v in value]
        return f"({inner[0]},)" if len(inner) == 1 else "(" + ", ".join(inner) + ")"
    if type(value) is dict:
        return "{" + ", ".join(f"{render_value(k)}: {render_value(v)}" for k, v in value.items()) + "}"
    if type(value) is datetime.timedelta:
        parts = [f"{name}={getattr(value, name)}" for name in ("days", "seconds", "microseconds")
                 if getattr(value, name)]
        return f"datetime.timedelta({', '.join(parts) or '0'})"
    if type(value) in _PATH_CLASSES:
        return f"{_PATH_CLASSES[type(value)]}({str.__repr__(str(value))})"
    raise UnrenderableError(
        f"a {type(value).__module__}.{type(value).__qualname__} cannot be written as a Python literal (the code "
        "writes str, int, float, bool, None, list, tuple, dict, datetime.timedelta and pathlib paths)"
    )


def _keyword(key: Any) -> str:
    problem = keyword_problem(key)
    if problem is not None:
        raise UnrenderableError(f"{problem}: {short_repr(key)}")
    return str(key)


def short_repr(value: Any, limit: int = 24) -> str:
    """A value's repr cut to `limit` characters: enough to recognise it, never a whole hostile payload."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def comment_lines(text: str, first: str = "# ", more: str = "# ") -> list[str]:
    """`text` as comment lines: split at every line break Python knows (CR included) and with NULs and other control
    characters escaped, so no text can end the comment and become code."""
    lines = text.splitlines() or [""]
    return [(first if i == 0 else more) + "".join(c if c.isprintable() or c == "\t" else c.encode(
        "unicode_escape").decode("ascii") for c in line) for i, line in enumerate(lines)]


def statement_lines(target: str, value: Any, width: int = 80) -> list[str]:
    """`target = value` on one line, or, when longer than `width`, one argument per line (as the Trainer call)."""
    line = f"{target} = {render_value(value)}"
    if len(line) <= width or not isinstance(value, Call):
        return [line]
    args = [render_value(a) for a in value.args] + [f"{_keyword(k)}={render_value(v)}" for k, v in value.kwargs]
    return [f"{target} = {value.func}("] + [f"    {a}," for a in args] + [")"]


def plan_code(plan: Plan, errors: Sequence[Issue] = (), snippets: Sequence[list[str]] = ()) -> str:
    """The plan as Python: errors (as comments), imports, snippets, the preparing statements, the Trainer call."""
    lines: list[str] = []
    if errors:
        lines += ["# This configuration has errors; fix them first:"]
        for i in errors:
            lines += comment_lines(f"{i.field}: {i.message}", first="#   - ", more="#     ")
        lines.append("")
    names = required_names(plan)
    lines += sorted((IMPORTS[n] for n in names if n in IMPORTS), key=lambda line: (line.startswith("from "), line))
    ours = [n for n in names if n in HPU_NB_NAMES]
    if ours:
        lines.append(f"from hpu_nb import {', '.join(ours)}")
    lines.append("")
    for snippet in snippets:
        if snippet:
            lines += snippet + [""]
    *prepare, last = plan
    for step in prepare:
        for comment in step.comments:
            lines += comment_lines(comment)
        if step.note:  # above the statement, not after it: the lines stay short enough for the panel
            lines += comment_lines(step.note)
        lines += statement_lines(step.target, step.value)
    if prepare:
        lines.append("")
    lines.append(f"{last.target} = {last.value.func}(")
    notes = dict(last.arg_notes)
    for key, value in last.value.kwargs:
        if key in notes:
            lines += comment_lines(notes[key], first="    # ", more="    # ")
        lines.append(f"    {_keyword(key)}={render_value(value)},")
    lines.append(")")
    return "\n".join(lines) + "\n"


def autocast_snippet(precision: str, style: str, device_type: str, backend_kind: str) -> list[str]:
    """Autocast written in the user's LightningModule (style "context" or "decorator"), as commented code lines."""
    dtype = str(autocast_dtype(precision))  # "torch.bfloat16": core's dtype of the precision
    where = f"{backend_kind} autocasts on {device_type!r}"
    call = f'torch.autocast(device_type="{device_type}", dtype={dtype})'
    how = {"context": "a torch.autocast context", "decorator": "the @torch.autocast decorator"}[style]
    lines = [f"# {precision} with {how} in your LightningModule "
             f"({where}); the Trainer itself stays in 32-true:", "#", "#     import torch", "#",
             "#     class MyModel(L.LightningModule):"]
    if style == "context":
        lines += ["#         def forward(self, x):", f"#             with {call}:",
                  "#                 return self.net(x)"]
    else:
        lines += [f"#         @{call}", "#         def forward(self, x):", "#             return self.net(x)"]
    return lines


def offload_snippet(lr: float) -> list[str]:
    """ZeRO-Offload: the configure_optimizers to paste into the LightningModule (commented code lines)."""
    return ["# ZeRO-Offload steps the optimizer on the CPU with DeepSpeed's own optimizer",
            "# (it refuses a torch one): return it from your LightningModule's",
            "# configure_optimizers, with the learning rate you want:",
            "#", "#     from deepspeed.ops.adam import DeepSpeedCPUAdam", "#",
            "#     class MyModel(L.LightningModule):", "#         def configure_optimizers(self):",
            f"#             return DeepSpeedCPUAdam(self.parameters(), lr={lr:g})"]

"""The op-list text fields of the form: what a user types (a file path, or op names separated by commas, semicolons
or spaces) to a TrainerConfig value and back.

Only the typed text is parsed here; the lists themselves (the LOWER_LIST-style files, op names, the rule that an op is
in one list only) are read and validated by hpu_nb.core.oplists, their one owner.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

OpList = Sequence[str] | str | None  # op names, or the path of a LOWER_LIST-style file


def parse_op_list(text: str) -> OpList:
    """What a user typed in an op-list field: a file path (contains '/' or ends in .txt), or op names."""
    text = (text or "").strip()
    if not text:
        return None
    if "/" in text or text.endswith(".txt") or text.startswith("."):
        return text
    names = [part for chunk in text.replace(";", ",").split(",") for part in chunk.split()]
    return [n for n in names if n]


def op_list_text(value: OpList) -> str:
    """The field's text for a value (parse_op_list's inverse)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return ", ".join(value)


def op_value(value: OpList) -> Any:
    """The plugin argument for a value: the file path as it is, or a list of names."""
    if isinstance(value, str):
        return value  # a file path
    return list(value or ())

"""The figures of an out-of-memory error (in use, requested, limit): its attributes, else what its message says."""

from __future__ import annotations

import re


def oom_figures(error: BaseException) -> dict[str, int | None]:
    """in_use / requested / limit of an out-of-memory error: its attributes, else what its message says."""
    message = str(error)
    figures: dict[str, int | None] = {key: getattr(error, key, None) for key in ("in_use", "requested", "limit")}
    if figures["requested"] is None:
        figures["requested"] = _first_int(message, (r"size::(\d+)", r"allocate (\d+) bytes"))
    if figures["limit"] is None:
        figures["limit"] = _first_int(message, (r"of Limit (\d+) bytes",))
    if figures["in_use"] is None:  # the emulated card says it exactly; a Gaudi's message does not
        figures["in_use"] = _first_int(message, (r"InUse (\d+) of Limit",))
    return figures


def _first_int(message: str, patterns: tuple[str, ...]) -> int | None:
    for pattern in patterns:
        match = re.search(pattern, message)
        if match:
            return int(match.group(1))
    return None

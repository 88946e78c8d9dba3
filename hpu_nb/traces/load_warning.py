"""The warning a trace loaded only in part raises: its own leaf module, so the parser and the model both import it."""

from __future__ import annotations


class TraceLoadWarning(UserWarning):
    """A trace loaded only in part (a truncated file, malformed events)."""

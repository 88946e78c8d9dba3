"""What the trace parser saw besides the events it kept: the counts and notes its warnings are made of."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ParseStats:
    """What the parser saw besides the events it kept."""

    bytes_read: int = 0
    malformed: int = 0  # events that could not be read (bad JSON, wrong types, no or an absurd timestamp)
    skipped: int = 0  # well-formed events of phases we do not show (flows, async, object events)
    unmatched: int = 0  # "B" without "E" or the other way round
    truncated: bool = False
    dropped_bytes: int = 0  # trailing bytes of a truncated file that held no complete event
    trailing_bytes: int = 0  # bytes after the end of the trace's JSON document (a second document?)
    gzip_error: str | None = None  # a corrupt gzip stream: what zlib said, and where
    stopped: str | None = None  # why reading stopped before the end of the file (an event too large to read)
    examples: list[str] = field(default_factory=list)  # a few malformed events, for the warning

    def note_malformed(self, raw: Any) -> None:
        self.malformed += 1
        if len(self.examples) < 3:
            text = bytes(raw)[:120].decode("utf-8", "replace") if not isinstance(raw, str) else raw[:120]
            self.examples.append(text)

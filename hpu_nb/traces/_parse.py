"""Streaming Chrome-trace parser: bytes in, compact columns out (this module: cutting the JSON into events).

Why this shape: a profiler trace is one JSON object whose bulk is the ``traceEvents`` array.
``json.load`` builds a dict per event (about 1 KB each) and needs the whole text in memory.
We read the file in fixed-size blocks, cut each block at an event boundary, and decode the
events of that piece with msgspec into small typed structs that keep only the fields we use
(unknown keys are skipped without building objects; ``args`` stays raw JSON). Each piece is
turned into numpy columns straight away, so peak memory is one block + its structs + the
columns, whatever the file size. The same loop serves plain and gzipped files, and a file
that ends early (a crashed run) simply yields the events that were complete.

The other jobs live beside it: bounded / gzip reading (reading.py), events into columns (event_columns.py), what was
seen (parse_stats.py).
"""

from __future__ import annotations

import os
import re
import stat
import warnings
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from hpu_nb.traces.event_columns import (
    MAX_TIME_US,
    PH_COMPLETE,
    PH_COUNTER,
    ArgsStore,
    EventColumns,
    MemoryColumns,
    decode_any,
    decode_event,
    decode_events,
    decode_raws,
)
from hpu_nb.traces.load_warning import TraceLoadWarning
from hpu_nb.traces.parse_stats import ParseStats
from hpu_nb.traces.reading import BLOCK_SIZE, GZIP_READ_SIZE, is_gzip, read_blocks

__all__ = ["BLOCK_SIZE", "GZIP_READ_SIZE", "MAX_TIME_US", "PH_COMPLETE", "PH_COUNTER", "ArgsStore", "MemoryColumns",
           "ParseStats", "ParsedTrace", "is_gzip", "parse_file"]

_KEY = re.compile(rb'"traceEvents"\s*:\s*\[\s*')
_SPLIT = re.compile(rb"\}\s*,\s*\{")  # the gap between two events: "},\n  {"
_ARRAY_END = re.compile(rb"\}\s*\]")
_MAX_SPLIT_TRIES = 8
SUFFIX_LIMIT = 4 << 20  # bytes of top-level JSON kept after the events array (the rest is only counted)
# Bounds that keep a hostile file (a gzip bomb of zeros or of whitespace) from growing the parser's buffer: a trace's
# top-level keys before "traceEvents" are kilobytes, and one event is at most a few MB of args.
HEADER_LIMIT = 16 << 20  # bytes searched for the start of the events array
EVENT_LIMIT = 64 << 20  # bytes without an event boundary (one event, or padding) before reading stops


@dataclass
class ParsedTrace:
    """Everything the parser produced: columns in file order, tables, top-level metadata, stats."""

    ts_us: np.ndarray
    dur_us: np.ndarray
    name_id: np.ndarray
    cat_id: np.ndarray
    track_id: np.ndarray
    ph: np.ndarray
    names: list[str]
    cats: list[str]
    tracks: list[tuple[Any, Any]]
    args: ArgsStore | None
    special_args: dict[int, bytes]  # args of counter events, by event index
    memory: MemoryColumns
    metadata_events: list[dict[str, Any]]
    top_level: dict[str, Any]
    stats: ParseStats


class _Parser:
    def __init__(self, keep_args: bool, block_size: int) -> None:
        self.cols = EventColumns()
        self.stats = ParseStats()
        self.keep_args = keep_args
        self.block_size = block_size

    # -- decoding events -----------------------------------------------------------------------
    def _add_text(self, text: bytes) -> None:
        """Decode a JSON array of events and add them; events of the wrong shape are counted, not fatal.

        Raises msgspec.DecodeError (with the byte offset) on a syntax error, RecursionError on absurd nesting.
        """
        try:
            events = decode_events(text)
        except msgspec.ValidationError:  # valid JSON up to here, some event of the wrong shape: one by one
            events = []
            for raw in decode_raws(text):
                try:
                    events.append(decode_event(raw))
                except (msgspec.DecodeError, RecursionError):
                    self.stats.note_malformed(raw)
        self.cols.add(events, self.stats, self.keep_args)

    def _decode_events(self, piece: bytes, final: bool) -> tuple[int, int | None]:
        """Decode the comma-separated events in `piece` (no brackets), skipping and counting unreadable ones.

        One bad event costs about one extra decode of the text before it, never the rest of the file: a syntax error
        names its byte, so the bad event is cut out between the event boundaries around that byte; errors without a
        position (nesting too deep) are found by halving the range. Returns (consumed, closed_at): `consumed` is
        len(piece) unless the piece is not `final` and its last event could not be read (the cut that ended the piece
        may lie inside it: it is tried again with more bytes); `closed_at` is where the events array's closing
        bracket ends inside `piece` (what follows is top-level JSON), or None.
        """
        stack = [(0, len(piece))]  # ranges still to decode, the next one on top (file order is kept)
        while stack:
            a, b = stack.pop()
            text = b"[" + piece[a:b] + b"]"
            try:
                self._add_text(text)
                continue
            except msgspec.DecodeError as err:
                where = _error_offset(err, len(text))
                if "trailing characters" in str(err):  # the array closed inside the range: events end here
                    # msgspec names the byte after the first trailing character: the array closes before that one
                    close = text.rindex(b"]", 0, where - 1)
                    self._add_text(text[: close + 1])
                    return len(piece), a + close
                at = a + where - 1
                start, end, after = self._bad_event_around(piece, a, b, at)
                right_is_queued = False
            except RecursionError:
                halves = self._halve(piece, a, b)
                if halves is not None:
                    stack.extend(reversed(halves))
                    continue
                at, start, end = a, a, b  # one event, nested too deeply to read
                boundary = _SPLIT.match(piece, b - 1) if b < len(piece) else None
                after = boundary.end() - 1 if boundary else None
                right_is_queued = True  # the range after it is on the stack already
            # piece[start:end] is the bad event; piece[a:start] holds good events before it
            if after is not None:
                closed_at = self._array_end_within(piece, at, end, after, len(piece))
                if closed_at is None:
                    self.stats.note_malformed(piece[start:end])
                    if not right_is_queued:
                        stack.append((after, b))
                    self._queue_before(stack, piece, a, start)
                    continue
            elif not final:  # the piece's last event: the cut that ended the piece may be inside it
                self._decode_before(piece, a, start)
                return start, None
            else:
                closed_at = self._close_tail(piece, start)
                if closed_at is None:  # the array never closes: the file was cut short inside this event
                    self.stats.truncated = True
                    self.stats.dropped_bytes = len(piece) - start
                    self._decode_before(piece, a, start)
                    return len(piece), None
            # the bad event was the array's last one: what follows closed_at is top-level JSON
            self.stats.note_malformed(piece[start:closed_at])
            self._decode_before(piece, a, start)
            return len(piece), closed_at
        return len(piece), None

    def _queue_before(self, stack: list[tuple[int, int]], piece: bytes, a: int, start: int) -> None:
        if start > a:
            stack.append((a, self._prev_event_end(piece, a, start)))

    def _decode_before(self, piece: bytes, a: int, start: int) -> None:
        """Decode the events of piece[a:start] (all before a bad one that ends the piece or the array)."""
        if start > a:
            self._decode_events(piece[a : self._prev_event_end(piece, a, start)], final=True)

    @staticmethod
    def _bad_event_around(piece: bytes, a: int, b: int, at: int) -> tuple[int, int, int | None]:
        """(start, end, next event start or None) of the event holding byte `at` of piece[a:b]."""
        at = min(max(at, a), b)
        start = a
        window = 1 << 16
        while True:
            lo = max(a, at - window)
            found = None
            for match in _SPLIT.finditer(piece, lo, min(at + 1, b)):
                found = match
            if found is not None:
                start = found.end() - 1
                break
            if lo == a:
                break
            window *= 4
        nxt = _SPLIT.search(piece, max(at, start), b)
        if nxt is None:
            return start, b, None
        return start, nxt.start() + 1, nxt.end() - 1

    @staticmethod
    def _array_end_within(piece: bytes, at: int, end: int, after: int, b: int) -> int | None:
        """Where the events array ends inside a bad event's span piece[at:end], when it does; else None.

        The bad event may be the array's last: then the next "event boundary" lies in the top-level JSON after it
        (e.g. Kineto's "deviceProperties": [{...}, {...}]). That is told apart from a `}]` inside the bad event's own
        args by the object after that boundary: a trace event has a phase ("ph"), a device record does not.
        """
        ends = list(_ARRAY_END.finditer(piece, at, end + 1))
        if not ends:
            return None
        nxt = _SPLIT.search(piece, after, b)
        following = piece[after : nxt.start() + 1 if nxt else b]
        try:
            event = decode_event(following)
        except msgspec.DecodeError as err:  # the last object of the top-level JSON: "{...}]}" after it
            if "trailing characters" not in str(err):
                return None
            try:
                event = decode_event(following[: following.rindex(b"}", 0, _error_offset(err, len(following))) + 1])
            except (msgspec.DecodeError, RecursionError, ValueError):
                return None
        except RecursionError:
            return None
        return None if event.ph else ends[0].end()

    @staticmethod
    def _prev_event_end(piece: bytes, a: int, event_start: int) -> int:
        """The end (after its '}') of the event before the one starting at `event_start`."""
        return piece.rindex(b"}", a, event_start) + 1

    @staticmethod
    def _halve(piece: bytes, a: int, b: int) -> list[tuple[int, int]] | None:
        """Two ranges of whole events splitting piece[a:b] near its middle; None for a single event."""
        mid = (a + b) // 2
        m = _SPLIT.search(piece, mid, b) or next(reversed(list(_SPLIT.finditer(piece, a, mid + 1))), None)
        if m is None:
            return None
        return [(a, m.start() + 1), (m.end() - 1, b)]

    def _close_tail(self, piece: bytes, start: int) -> int | None:
        """At the end of the file, an unreadable last event: where the events array closes after it, if it does.

        None means the array never closes: the file was cut short inside this event.
        """
        tail = piece[start:]
        for m in list(_ARRAY_END.finditer(tail))[-_MAX_SPLIT_TRIES:][::-1]:
            rest = tail[m.end() :].strip()
            if not rest or rest == b"}" or (rest.startswith(b",") and rest.endswith(b"}")):
                return start + m.end()
        return None

    def _decode_upto_split(self, buf: bytes) -> tuple[bytes, bytes | None]:
        """Decode the events in buf up to its last event boundary; return (the rest, the top-level text after the
        events array if it ended here, else None)."""
        search_from = max(0, len(buf) - (1 << 20))
        while True:
            matches = list(_SPLIT.finditer(buf, search_from))
            if matches or search_from == 0:
                break
            search_from = max(0, search_from - (4 << 20))
        if not matches:
            return buf, None
        last = matches[-1]
        piece = buf[: last.start() + 1]
        consumed, closed_at = self._decode_events(piece, final=False)
        if closed_at is not None:
            return b"", buf[closed_at:]
        return buf[last.end() - 1 :] if consumed == len(piece) else buf[consumed:], None

    # -- the main loop -------------------------------------------------------------------------
    def parse(self, path: str) -> ParsedTrace:
        buf = b""
        prefix = b""
        suffix: bytes | None = None  # the top-level JSON after the events array, once it has ended
        events_start = None
        for block in read_blocks(path, self.stats, self.block_size):
            if suffix is not None:
                suffix = self._grow_suffix(suffix, block)
                continue
            buf += block
            if events_start is None:
                events_start, prefix = self._find_events(buf)
                if events_start is None:
                    if len(buf) > HEADER_LIMIT:
                        raise ValueError(f"not a Chrome trace: no 'traceEvents' array in its first {len(buf):,} bytes"
                                         f" (first bytes: {buf[:60]!r})")
                    continue
                buf = buf[events_start:]
            if buf[:1].isspace():  # padding between events is dropped at once, however much of it there is
                buf = buf.lstrip()
            buf, suffix = self._decode_upto_split(buf)
            if suffix is None and len(buf) > EVENT_LIMIT:
                buf = self._drop_padding(buf)
            if suffix is None and len(buf) > EVENT_LIMIT:
                self.stats.stopped = (f"{len(buf):,} bytes without the end of an event, from decompressed byte"
                                      f" {self.stats.bytes_read - len(buf):,} (one giant event, or padding inside one)")
                self.stats.truncated = True
                self.stats.dropped_bytes = len(buf)
                return self._result(prefix, b"")
        if events_start is None:
            events_start, prefix = self._find_events(buf, at_eof=True)
            buf = buf[events_start:]
        if suffix is None:
            suffix = self._finish(buf)
        return self._result(prefix, suffix)

    def _drop_padding(self, buf: bytes) -> bytes:
        """Whole events followed by a comma and a long run of whitespace: decode the events, drop the padding.

        Only when they decode as complete events: otherwise the whitespace may lie inside a string, where it counts."""
        head = buf.rstrip()
        if len(head) == len(buf) or not head.endswith(b","):
            return buf
        try:
            self._add_text(b"[" + head[:-1] + b"]")
        except (msgspec.DecodeError, RecursionError):
            return buf
        return b""

    def _grow_suffix(self, suffix: bytes, block: bytes) -> bytes:
        """Keep at most SUFFIX_LIMIT bytes of what follows the events (top-level keys); count the rest."""
        room = SUFFIX_LIMIT - len(suffix)
        if room < len(block):
            self.stats.trailing_bytes += len(block) - max(room, 0)
        return suffix + block[: max(room, 0)]

    def _find_events(self, buf: bytes, at_eof: bool = False) -> tuple[int | None, bytes]:
        """Where the events array starts; a bare JSON array of events is accepted too."""
        stripped = buf.lstrip()
        if stripped.startswith(b"["):
            return len(buf) - len(stripped) + 1, b""
        m = _KEY.search(buf)
        if m:
            return m.end(), buf[: m.start()]
        if at_eof:
            if not buf.strip():
                raise ValueError("not a Chrome trace: the file is empty")
            raise ValueError(
                f"not a Chrome trace: no 'traceEvents' array and not a JSON array of events (first bytes: {buf[:60]!r})"
            )
        return None, b""

    def _finish(self, buf: bytes) -> bytes:
        """Decode the last events; return the JSON text after the events array (top-level keys)."""
        piece = buf.rstrip(b" \t\r\n,")  # a file cut right after an event's comma still has that event whole
        if not piece:
            self.stats.truncated = True
            return b""
        _, closed_at = self._decode_events(piece, final=True)
        if closed_at is None:
            self.stats.truncated = True
            return b""
        return buf[closed_at:]

    def _result(self, prefix: bytes, suffix: bytes) -> ParsedTrace:
        cols, stats = self.cols, self.stats
        top_level: dict[str, Any] = {}
        if prefix.strip():
            text = prefix.rstrip().rstrip(b",")
            text = text + (b"," if text.strip() != b"{" else b"") + suffix.strip().lstrip(b",")
            if not text.rstrip().endswith(b"}"):
                text += b"}"
            top_level = self._decode_top_level(text, prefix)
        elif suffix.strip():  # a bare array of events: nothing may follow it
            stats.trailing_bytes += len(suffix.strip())
        for stack in cols.open_spans.values():
            stats.unmatched += len(stack)

        def cat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
            return np.concatenate(parts) if parts else np.empty(0, dtype)

        meta = []
        for e in cols.metadata:
            try:
                args = decode_any(e.args) if len(e.args) else {}
            except (msgspec.DecodeError, RecursionError):
                args = {}
            meta.append({"name": e.name, "pid": e.pid, "tid": e.tid, "args": args})
        return ParsedTrace(
            ts_us=cat(cols.ts, np.float64),
            dur_us=cat(cols.dur, np.float64),
            name_id=cat(cols.name_id, np.int32),
            cat_id=cat(cols.cat_id, np.int32),
            track_id=cat(cols.track_id, np.int32),
            ph=cat(cols.ph, np.uint8),
            names=list(cols.names),
            cats=list(cols.cats),
            tracks=list(cols.tracks),
            args=ArgsStore(cols.args_blob, cols.args_len) if self.keep_args else None,
            special_args=dict(cols.special),
            memory=cols.memory(),
            metadata_events=meta,
            top_level=top_level,
            stats=stats,
        )

    def _decode_top_level(self, text: bytes, prefix: bytes) -> dict[str, Any]:
        """The trace object's keys other than its events; counts what follows the object (a second document)."""
        try:
            value = decode_any(text)
        except msgspec.DecodeError as err:
            if "trailing characters" not in str(err):
                return _salvage_header(prefix)
            end = text.rindex(b"}", 0, _error_offset(err, len(text)) - 1) + 1  # msgspec: the byte after the first
            self.stats.trailing_bytes += len(text[end:].strip())
            try:
                value = decode_any(text[:end])
            except (msgspec.DecodeError, RecursionError):
                return _salvage_header(prefix)
        except RecursionError:
            return _salvage_header(prefix)
        return value if isinstance(value, dict) else {}


_ERROR_AT = re.compile(r"\(byte (\d+)\)")


def _error_offset(err: msgspec.DecodeError, text_len: int) -> int:
    """The byte offset msgspec names in a syntax error ("... (byte 123)"); the end for "Input data was truncated"."""
    m = _ERROR_AT.search(str(err))
    return int(m.group(1)) if m else text_len


def _salvage_header(prefix: bytes) -> dict[str, Any]:
    """Top-level keys before the events when the rest of the object cannot be read (truncated file)."""
    text = prefix.rstrip().rstrip(b",") + b"}"
    try:
        value = decode_any(text)
        return value if isinstance(value, dict) else {}
    except (msgspec.DecodeError, RecursionError):
        return {}


def parse_file(path: str, keep_args: bool = True, block_size: int = BLOCK_SIZE) -> ParsedTrace:
    """Parse the Chrome trace at `path` (plain or gzipped) into columns.

    Only regular files are read: a FIFO, socket or device named like a trace would block or never end. A corrupt
    gzip file is named as such.
    """
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise ValueError(
            f"{path} is {_file_kind(mode)}, not a regular file: a trace must be a .json or .json.gz file. Pass the"
            " trace file itself, or remove this entry from the folder."
        )
    parser = _Parser(keep_args, block_size)
    try:
        parsed = parser.parse(path)
    except ValueError as err:
        if parser.stats.gzip_error is not None and parser.stats.bytes_read == 0:
            raise ValueError(
                f"{path} is a corrupt gzip file: nothing could be decompressed ({parser.stats.gzip_error})."
                " Copy the trace again from where it was written."
            ) from err
        raise
    _warn_unusual(path, parsed.stats)
    return parsed


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _warn_unusual(path: str, stats: ParseStats) -> None:
    """Warn about what `load`'s own warnings (truncation, malformed events) do not cover."""
    if stats.gzip_error is not None:
        warnings.warn(
            f"{path}: the gzip data is corrupt from some point on ({stats.gzip_error}); the events before it were"
            " loaded.",
            TraceLoadWarning,
            stacklevel=4,
        )
    if stats.stopped is not None:
        warnings.warn(
            f"{path}: reading stopped at {stats.stopped}; the events before it were loaded. A trace hpu_nb can show"
            f" has event boundaries at least every {EVENT_LIMIT >> 20} MB.",
            TraceLoadWarning,
            stacklevel=4,
        )
    if stats.trailing_bytes:
        warnings.warn(
            f"{path}: {stats.trailing_bytes:,} bytes after the end of the trace's JSON document were ignored (two JSON"
            " documents in one file, e.g. traces concatenated?). Only the first document was loaded.",
            TraceLoadWarning,
            stacklevel=4,
        )

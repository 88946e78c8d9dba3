"""Streaming Chrome-trace parser: bytes in, compact columns out.

Why this shape: a profiler trace is one JSON object whose bulk is the ``traceEvents`` array.
``json.load`` builds a dict per event (about 1 KB each) and needs the whole text in memory.
We read the file in fixed-size blocks, cut each block at an event boundary, and decode the
events of that piece with msgspec into small typed structs that keep only the fields we use
(unknown keys are skipped without building objects; ``args`` stays raw JSON). Each piece is
turned into numpy columns straight away, so peak memory is one block + its structs + the
columns, whatever the file size. The same loop serves plain and gzipped files, and a file
that ends early (a crashed run) simply yields the events that were complete.
"""

from __future__ import annotations

import math
import os
import re
import stat
import warnings
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from hpu_nb.traces.load_warning import TraceLoadWarning

BLOCK_SIZE = 8 << 20  # bytes read per step; bounds the transient memory of the parser

_KEY = re.compile(rb'"traceEvents"\s*:\s*\[\s*')
_SPLIT = re.compile(rb"\}\s*,\s*\{")  # the gap between two events: "},\n  {"
_ARRAY_END = re.compile(rb"\}\s*\]")
_MAX_SPLIT_TRIES = 8
# Timestamps and durations (microseconds) beyond this are malformed: the trace holds times as int64 nanoseconds
# from its first event, and (largest - smallest timestamp + longest duration) must fit. 3e15 us since the Unix epoch
# is the year 2065; real durations are far shorter.
MAX_TIME_US = 3e15
GZIP_READ_SIZE = 256 << 10  # compressed bytes read at a time
SUFFIX_LIMIT = 4 << 20  # bytes of top-level JSON kept after the events array (the rest is only counted)
# Bounds that keep a hostile file (a gzip bomb of zeros or of whitespace) from growing the parser's buffer: a trace's
# top-level keys before "traceEvents" are kilobytes, and one event is at most a few MB of args.
HEADER_LIMIT = 16 << 20  # bytes searched for the start of the events array
EVENT_LIMIT = 64 << 20  # bytes without an event boundary (one event, or padding) before reading stops
GZIP_FEED_SIZE = 16 << 10  # compressed bytes handed to zlib at once: a corruption loses at most this much output


def _squeeze(blob: bytes) -> bytes:
    """Drop pretty-printing (newlines and most indentation) from JSON text; strings cannot hold raw newlines.

    bytes.replace runs at memchr speed; a regex over the same text is several times slower.
    """
    if b"\n" not in blob:
        return blob
    for k in (12, 8, 6, 4, 2):  # shrink indentation runs; the few spaces left are harmless JSON whitespace
        blob = blob.replace(b"\n" + b" " * k, b"\n")
    return blob.replace(b"\r", b"").replace(b"\n", b"")


class _Event(msgspec.Struct, gc=False):
    """The fields of one trace event that we keep; everything else is skipped by the decoder."""

    ph: str = ""
    name: str = ""
    cat: str = ""
    ts: float = math.nan
    dur: float = 0.0
    pid: int | str = 0
    tid: int | str = 0
    args: msgspec.Raw = msgspec.Raw()


_decode_events = msgspec.json.Decoder(list[_Event]).decode
_decode_raws = msgspec.json.Decoder(list[msgspec.Raw]).decode
_decode_event = msgspec.json.Decoder(_Event).decode
_decode_any = msgspec.json.decode

# phase codes stored in the `ph` column
PH_COMPLETE, PH_INSTANT, PH_COUNTER = 0, 1, 2
MEMORY_EVENT = "[memory]"
_KEPT_PHASES = {"X": PH_COMPLETE, "i": PH_INSTANT, "I": PH_INSTANT, "C": PH_COUNTER}
_FLOW_PHASES = frozenset("sftbenNOD")  # flows, async and object events: not drawn on tracks


class _MemoryArgs(msgspec.Struct, gc=False):
    allocated: int = msgspec.field(default=0, name="Total Allocated")
    reserved: int = msgspec.field(default=0, name="Total Reserved")
    device_type: int | str | None = msgspec.field(default=None, name="Device Type")
    device_id: int | None = msgspec.field(default=-1, name="Device Id")


_decode_memory_list = msgspec.json.Decoder(list[_MemoryArgs]).decode


def _decode_memory_one(raw: bytes) -> _MemoryArgs | None:
    try:
        return msgspec.json.decode(raw, type=_MemoryArgs)
    except msgspec.DecodeError:
        return None


def _memory_device(kind: Any, dev: Any) -> str:
    names = {
        0: "cpu",
        1: "cuda",
        2: "mkldnn",
        3: "opengl",
        4: "opencl",
        5: "ideep",
        6: "hip",
        7: "fpga",
        8: "maia",
        9: "xla",
        10: "vulkan",
        11: "metal",
        12: "xpu",
        13: "mps",
        14: "meta",
        15: "hpu",
    }
    name = names.get(kind, str(kind)) if isinstance(kind, int) else str(kind or "?")
    return name if dev in (-1, None) else f"{name}:{dev}"


@dataclass
class MemoryColumns:
    """The profiler's [memory] events, decoded while parsing (their args are all we need of them)."""

    index: np.ndarray  # event index in file order (kept events)
    ts_us: np.ndarray
    allocated: np.ndarray
    reserved: np.ndarray
    device: np.ndarray  # index into `devices`
    devices: list[str]

    def args(self, k: int) -> dict[str, Any]:
        return {
            "Total Allocated": int(self.allocated[k]),
            "Total Reserved": int(self.reserved[k]),
            "device": self.devices[int(self.device[k])],
        }


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


class _Columns:
    """Growing per-event columns plus the interned name / category / track tables."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.cats: dict[str, int] = {"": 0}
        self.tracks: dict[tuple[Any, Any], int] = {}
        self.ts: list[np.ndarray] = []
        self.dur: list[np.ndarray] = []
        self.name_id: list[np.ndarray] = []
        self.cat_id: list[np.ndarray] = []
        self.track_id: list[np.ndarray] = []
        self.ph: list[np.ndarray] = []
        self.args_blob: list[bytes] = []  # raw JSON args of kept events, one blob per piece
        self.args_len: list[np.ndarray] = []  # positions of the NUL separators inside each blob
        self.special: list[tuple[int, bytes]] = []  # (event index, args) of counter events
        self.mem: dict[str, list[Any]] = {"index": [], "ts": [], "allocated": [], "reserved": [], "device": []}
        self.mem_devices: dict[str, int] = {}
        self.count = 0
        self.metadata: list[_Event] = []  # "M" events: process / thread names and sort order
        self.open_spans: dict[tuple[Any, Any], list[_Event]] = {}  # "B" events waiting for their "E"

    def add(self, events: list[_Event], stats: ParseStats, keep_args: bool) -> None:
        kept: list[_Event] = []
        append = kept.append
        for e in events:
            code = _KEPT_PHASES.get(e.ph)
            if code is not None:
                append(e)
            elif e.ph == "M":
                self.metadata.append(e)
            elif e.ph == "B" or e.ph == "E":
                closed = self._pair(e, stats)
                if closed is not None:
                    append(closed)
            elif e.ph in _FLOW_PHASES:
                stats.skipped += 1
            else:
                stats.note_malformed(msgspec.json.encode(e))
        if not kept:
            return
        n = len(kept)
        ts = np.fromiter([e.ts for e in kept], np.float64, n)
        dur = np.fromiter([e.dur for e in kept], np.float64, n)
        good = (np.abs(ts) <= MAX_TIME_US) & (dur >= 0) & (dur <= MAX_TIME_US)  # False for NaN and infinities too
        if not good.all():  # rare: count them, keep the others
            for i in np.flatnonzero(~good):
                e = kept[i]
                why = "a negative duration" if e.dur < 0 else f"beyond +-{MAX_TIME_US:.0e} us"
                stats.note_malformed(f"{e.name!r} at ts={e.ts!r} us, dur={e.dur!r} us: {why}")
            kept = [e for e, ok in zip(kept, good.tolist()) if ok]
            ts, dur, n = ts[good], dur[good], len(kept)
            if not kept:
                return
        names, cats, tracks = self.names, self.cats, self.tracks
        self.ts.append(ts)
        self.dur.append(dur)
        self.name_id.append(np.fromiter([names.setdefault(e.name, len(names)) for e in kept], np.int32, n))
        self.cat_id.append(np.fromiter([cats.setdefault(e.cat, len(cats)) for e in kept], np.int32, n))
        self.track_id.append(np.fromiter([tracks.setdefault((e.pid, e.tid), len(tracks)) for e in kept], np.int32, n))
        self.ph.append(np.fromiter([_KEPT_PHASES[e.ph] for e in kept], np.uint8, n))
        self.special.extend(
            (self.count + int(i), bytes(kept[i].args)) for i in np.flatnonzero(self.ph[-1] == PH_COUNTER)
        )
        memory_id = names.get(MEMORY_EVENT)
        if memory_id is not None:
            self._add_memory(kept, np.flatnonzero(self.name_id[-1] == memory_id))
        if keep_args:
            # One blob per piece, NUL between events (a raw NUL cannot occur in JSON text), the pretty-printing
            # newlines + indentation squeezed out (a raw newline cannot occur inside a JSON string either).
            blob = _squeeze(b"\x00".join([e.args for e in kept]))
            self.args_blob.append(blob)
            self.args_len.append(np.flatnonzero(np.frombuffer(blob, np.uint8) == 0).astype(np.int64))
        self.count += n

    def _add_memory(self, kept: list[_Event], which: np.ndarray) -> None:
        """Decode the args of this piece's [memory] events in one go into compact columns."""
        if not len(which):
            return
        raws = [kept[i].args for i in which]
        try:
            decoded: list[_MemoryArgs | None] = list(
                _decode_memory_list(b"[" + b",".join(r or b"{}" for r in raws) + b"]")
            )
        except msgspec.DecodeError:  # one bad among them: one by one
            decoded = [_decode_memory_one(bytes(r)) for r in raws]
        devices, mem = self.mem_devices, self.mem
        for i, m in zip(which, decoded):
            if m is None:
                continue
            mem["index"].append(self.count + int(i))
            mem["ts"].append(kept[i].ts)
            mem["allocated"].append(m.allocated)
            mem["reserved"].append(m.reserved)
            mem["device"].append(devices.setdefault(_memory_device(m.device_type, m.device_id), len(devices)))

    def memory(self) -> MemoryColumns:
        m = self.mem
        return MemoryColumns(
            np.array(m["index"], np.int64),
            np.array(m["ts"], np.float64),
            np.array(m["allocated"], np.int64),
            np.array(m["reserved"], np.int64),
            np.array(m["device"], np.int32),
            list(self.mem_devices),
        )

    def _pair(self, e: _Event, stats: ParseStats) -> _Event | None:
        """Turn a matching "B"/"E" pair on one thread into a complete ("X") event."""
        if e.ts != e.ts:
            stats.note_malformed(msgspec.json.encode(e))
            return None
        stack = self.open_spans.setdefault((e.pid, e.tid), [])
        if e.ph == "B":
            stack.append(e)
            return None
        if not stack:
            stats.unmatched += 1
            return None
        begin = stack.pop()
        return _Event("X", begin.name, begin.cat, begin.ts, e.ts - begin.ts, begin.pid, begin.tid, begin.args)


class ArgsStore:
    """The raw JSON ``args`` of every event, packed in one blob per parsed piece; decoded one event at a time."""

    def __init__(self, blobs: list[bytes], separators: list[np.ndarray]) -> None:
        self._blobs = blobs
        self._seps = separators  # NUL positions: event k of a piece spans (sep[k-1] + 1, sep[k])
        self._first = np.cumsum([0] + [len(s) + 1 for s in separators])

    @property
    def nbytes(self) -> int:
        return sum(len(b) for b in self._blobs) + sum(s.nbytes for s in self._seps)

    def raw(self, index: int) -> bytes:
        piece = int(np.searchsorted(self._first, index, side="right")) - 1
        if index < 0 or piece >= len(self._blobs):
            raise IndexError(index)
        local = index - int(self._first[piece])
        seps = self._seps[piece]
        start = int(seps[local - 1]) + 1 if local else 0
        end = int(seps[local]) if local < len(seps) else len(self._blobs[piece])
        return self._blobs[piece][start:end]

    def get(self, index: int) -> dict[str, Any]:
        raw = self.raw(index)
        if not raw:
            return {}
        try:
            value = _decode_any(raw)
        except (msgspec.DecodeError, RecursionError):
            return {}
        return value if isinstance(value, dict) else {"value": value}


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


def is_gzip(path: str) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


def _blocks(path: str, stats: ParseStats, block_size: int) -> Iterator[bytes]:
    """The file's (decompressed) bytes in blocks; a gzip stream cut short or corrupt yields all it had."""
    with open(path, "rb") as fh:
        if not is_gzip(path):
            while block := fh.read(block_size):
                stats.bytes_read += len(block)
                yield block
            return
        pending: list[bytes] = []  # decompressed output, handed on in blocks of about block_size
        pending_size = 0
        for out in _gunzip(fh, stats, lambda: stats.bytes_read + pending_size):  # noqa: B023 -- the size now, on purpose
            pending.append(out)
            pending_size += len(out)
            if pending_size >= block_size:
                stats.bytes_read += pending_size
                yield b"".join(pending)
                pending, pending_size = [], 0
        if pending_size:
            stats.bytes_read += pending_size
            yield b"".join(pending)


def _gunzip(fh: Any, stats: ParseStats, produced: Any) -> Iterator[bytes]:
    """Decompressed pieces of a gzip file (concatenated members too), each at most about GZIP_FEED_SIZE x the
    compression ratio; at a corrupt point, stops after noting zlib's error in `stats` (all output before it is kept)."""
    unzip = zlib.decompressobj(wbits=31)
    while read := fh.read(GZIP_READ_SIZE):
        for at in range(0, len(read), GZIP_FEED_SIZE):  # small feeds: a corruption loses at most one feed's output
            chunk = read[at : at + GZIP_FEED_SIZE]
            while chunk:
                try:
                    out = unzip.decompress(chunk)
                except zlib.error as err:
                    stats.gzip_error = f"{err} (after {produced():,} decompressed bytes)"
                    stats.truncated = True
                    return
                if out:
                    yield out
                chunk = b""
                if unzip.eof:  # the next member, if any, starts in what this one left
                    chunk = unzip.unused_data
                    unzip = zlib.decompressobj(wbits=31)
    if not unzip.eof and unzip.unconsumed_tail == b"" and (tail := unzip.flush()):
        yield tail


class _Parser:
    def __init__(self, keep_args: bool, block_size: int) -> None:
        self.cols = _Columns()
        self.stats = ParseStats()
        self.keep_args = keep_args
        self.block_size = block_size

    # -- decoding events -----------------------------------------------------------------------
    def _add_text(self, text: bytes) -> None:
        """Decode a JSON array of events and add them; events of the wrong shape are counted, not fatal.

        Raises msgspec.DecodeError (with the byte offset) on a syntax error, RecursionError on absurd nesting.
        """
        try:
            events = _decode_events(text)
        except msgspec.ValidationError:  # valid JSON up to here, some event of the wrong shape: one by one
            events = []
            for raw in _decode_raws(text):
                try:
                    events.append(_decode_event(raw))
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
            event = _decode_event(following)
        except msgspec.DecodeError as err:  # the last object of the top-level JSON: "{...}]}" after it
            if "trailing characters" not in str(err):
                return None
            try:
                event = _decode_event(following[: following.rindex(b"}", 0, _error_offset(err, len(following))) + 1])
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
        for block in _blocks(path, self.stats, self.block_size):
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
                args = _decode_any(e.args) if len(e.args) else {}
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
            value = _decode_any(text)
        except msgspec.DecodeError as err:
            if "trailing characters" not in str(err):
                return _salvage_header(prefix)
            end = text.rindex(b"}", 0, _error_offset(err, len(text)) - 1) + 1  # msgspec: the byte after the first
            self.stats.trailing_bytes += len(text[end:].strip())
            try:
                value = _decode_any(text[:end])
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
        value = _decode_any(text)
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

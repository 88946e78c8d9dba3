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
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

BLOCK_SIZE = 8 << 20  # bytes read per step; bounds the transient memory of the parser

_KEY = re.compile(rb'"traceEvents"\s*:\s*\[\s*')
_SPLIT = re.compile(rb"\}\s*,\s*\{")  # the gap between two events: "},\n  {"
_ARRAY_END = re.compile(rb"\}\s*\]")
_MAX_SPLIT_TRIES = 8


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
    malformed: int = 0  # events that could not be read (wrong types, not an object, no timestamp)
    skipped: int = 0  # well-formed events of phases we do not show (flows, async, object events)
    unmatched: int = 0  # "B" without "E" or the other way round
    truncated: bool = False
    dropped_bytes: int = 0  # trailing bytes of a truncated file that held no complete event
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
                if e.ts != e.ts:  # NaN: no timestamp
                    stats.note_malformed(msgspec.json.encode(e))
                    continue
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
        names, cats, tracks = self.names, self.cats, self.tracks
        self.ts.append(np.fromiter([e.ts for e in kept], np.float64, n))
        self.dur.append(np.fromiter([e.dur for e in kept], np.float64, n))
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
        except msgspec.DecodeError:
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
    """The file's (decompressed) bytes in blocks; a gzip stream cut short yields all it had."""
    with open(path, "rb") as fh:
        if not is_gzip(path):
            while block := fh.read(block_size):
                stats.bytes_read += len(block)
                yield block
            return
        unzip = zlib.decompressobj(wbits=31)
        while chunk := fh.read(block_size):
            while chunk:
                try:
                    out = unzip.decompress(chunk)
                except zlib.error:  # corrupt from here on: keep what we had
                    stats.truncated = True
                    return
                if out:
                    stats.bytes_read += len(out)
                    yield out
                chunk = unzip.unused_data  # concatenated gzip members
                if unzip.eof:
                    unzip = zlib.decompressobj(wbits=31)
                else:
                    chunk = b""
        if not unzip.eof and unzip.unconsumed_tail == b"":
            tail = unzip.flush()
            if tail:
                stats.bytes_read += len(tail)
                yield tail


class _Parser:
    def __init__(self, keep_args: bool, block_size: int) -> None:
        self.cols = _Columns()
        self.stats = ParseStats()
        self.keep_args = keep_args
        self.block_size = block_size

    # -- decoding one piece of the events array ------------------------------------------------
    def _decode_piece(self, piece: bytes) -> bool:
        """Decode `piece` (events separated by commas, no brackets). False on a JSON syntax error."""
        text = b"[" + piece + b"]"
        try:
            events = _decode_events(text)
        except msgspec.ValidationError:
            events = self._decode_leniently(text)
            if events is None:
                return False
        except msgspec.DecodeError:
            return False
        self.cols.add(events, self.stats, self.keep_args)
        return True

    def _decode_leniently(self, text: bytes) -> list[_Event] | None:
        """Valid JSON with some bad events: keep the good ones, count the others."""
        try:
            raws = _decode_raws(text)
        except msgspec.DecodeError:
            return None
        events = []
        for raw in raws:
            try:
                events.append(_decode_event(raw))
            except msgspec.DecodeError:
                self.stats.note_malformed(raw)
        return events

    def _decode_upto_split(self, buf: bytes, start: int) -> int | None:
        """Decode the events in buf[start:] up to one of the last event boundaries; return where the rest begins."""
        search_from = max(start, len(buf) - (1 << 20))
        while True:
            matches = list(_SPLIT.finditer(buf, search_from))
            if matches or search_from == start:
                break
            search_from = max(start, search_from - (4 << 20))
        for m in reversed(matches[-_MAX_SPLIT_TRIES:]):
            if self._decode_piece(buf[start : m.start() + 1]):
                return m.end() - 1  # the "{" of the next event
        return None

    # -- the main loop -------------------------------------------------------------------------
    def parse(self, path: str) -> ParsedTrace:
        buf = b""
        prefix = b""
        events_start = None
        blocks = _blocks(path, self.stats, self.block_size)
        for block in blocks:
            buf += block
            if events_start is None:
                events_start, prefix = self._find_events(buf)
                if events_start is None:
                    continue
                buf = buf[events_start:]
            rest = self._decode_upto_split(buf, 0)
            if rest is not None:
                buf = buf[rest:]
        if events_start is None:
            events_start, prefix = self._find_events(buf, at_eof=True)
            buf = buf[events_start:]
        suffix = self._finish(buf)
        return self._result(prefix, suffix)

    def _find_events(self, buf: bytes, at_eof: bool = False) -> tuple[int | None, bytes]:
        """Where the events array starts; a bare JSON array of events is accepted too."""
        stripped = buf.lstrip()
        if stripped.startswith(b"["):
            return len(buf) - len(stripped) + 1, b""
        m = _KEY.search(buf)
        if m:
            return m.end(), buf[: m.start()]
        if at_eof:
            raise ValueError(
                f"not a Chrome trace: no 'traceEvents' array and not a JSON array of events (first bytes: {buf[:60]!r})"
            )
        return None, b""

    def _finish(self, buf: bytes) -> bytes:
        """Decode the last events; return the JSON text after the events array (top-level keys)."""
        stripped = buf.strip()
        if stripped.startswith(b"]"):  # empty events array
            return stripped[1:]
        for m in _ARRAY_END.finditer(buf):
            if self._decode_piece(buf[: m.start() + 1]):
                return buf[m.end() :]
        # No closing bracket that works: the file was cut short (or is corrupt from here on).
        self.stats.truncated = True
        tail = buf.rstrip().rstrip(b",")
        if tail.endswith(b"}") and self._decode_piece(tail):
            self.stats.dropped_bytes = len(buf) - len(tail)
            return b""
        matches = list(_SPLIT.finditer(buf))
        for m in reversed(matches[-64:]):
            if self._decode_piece(buf[: m.start() + 1]):
                self.stats.dropped_bytes = len(buf) - m.start() - 1
                return b""
        self.stats.dropped_bytes = len(buf)
        return b""

    def _result(self, prefix: bytes, suffix: bytes) -> ParsedTrace:
        cols, stats = self.cols, self.stats
        top_level: dict[str, Any] = {}
        if prefix.strip():
            text = prefix.rstrip().rstrip(b",")
            text = text + (b"," if text.strip() != b"{" else b"") + suffix.strip().lstrip(b",")
            if not text.rstrip().endswith(b"}"):
                text += b"}"
            try:
                value = _decode_any(text)
                if isinstance(value, dict):
                    top_level = value
            except msgspec.DecodeError:
                top_level = _salvage_header(prefix)
        for stack in cols.open_spans.values():
            stats.unmatched += len(stack)

        def cat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
            return np.concatenate(parts) if parts else np.empty(0, dtype)

        meta = []
        for e in cols.metadata:
            try:
                args = _decode_any(e.args) if len(e.args) else {}
            except msgspec.DecodeError:
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


def _salvage_header(prefix: bytes) -> dict[str, Any]:
    """Top-level keys before the events when the rest of the object cannot be read (truncated file)."""
    text = prefix.rstrip().rstrip(b",") + b"}"
    try:
        value = _decode_any(text)
        return value if isinstance(value, dict) else {}
    except msgspec.DecodeError:
        return {}


def parse_file(path: str, keep_args: bool = True, block_size: int = BLOCK_SIZE) -> ParsedTrace:
    """Parse the Chrome trace at `path` (plain or gzipped) into columns."""
    return _Parser(keep_args, block_size).parse(path)

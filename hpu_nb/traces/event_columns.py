"""Trace events normalised into columns: the typed event struct the decoder fills, the phases kept, B/E pairs
closed into complete spans, names / categories / tracks interned, [memory] args decoded, and the raw args packed.

Why columns: a dict per event costs about 1 KB; numpy columns per parsed piece cost a few bytes per field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from hpu_nb.traces.parse_stats import ParseStats

# Timestamps and durations (microseconds) beyond this are malformed: the trace holds times as int64 nanoseconds
# from its first event, and (largest - smallest timestamp + longest duration) must fit. 3e15 us since the Unix epoch
# is the year 2065; real durations are far shorter.
MAX_TIME_US = 3e15


def _squeeze(blob: bytes) -> bytes:
    """Drop pretty-printing (newlines and most indentation) from JSON text; strings cannot hold raw newlines.

    bytes.replace runs at memchr speed; a regex over the same text is several times slower.
    """
    if b"\n" not in blob:
        return blob
    for k in (12, 8, 6, 4, 2):  # shrink indentation runs; the few spaces left are harmless JSON whitespace
        blob = blob.replace(b"\n" + b" " * k, b"\n")
    return blob.replace(b"\r", b"").replace(b"\n", b"")


class TraceEvent(msgspec.Struct, gc=False):
    """The fields of one trace event that we keep; everything else is skipped by the decoder."""

    ph: str = ""
    name: str = ""
    cat: str = ""
    ts: float = math.nan
    dur: float = 0.0
    pid: int | str = 0
    tid: int | str = 0
    args: msgspec.Raw = msgspec.Raw()


decode_events = msgspec.json.Decoder(list[TraceEvent]).decode
decode_raws = msgspec.json.Decoder(list[msgspec.Raw]).decode
decode_event = msgspec.json.Decoder(TraceEvent).decode
decode_any = msgspec.json.decode

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


class EventColumns:
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
        self.metadata: list[TraceEvent] = []  # "M" events: process / thread names and sort order
        self.open_spans: dict[tuple[Any, Any], list[TraceEvent]] = {}  # "B" events waiting for their "E"

    def add(self, events: list[TraceEvent], stats: ParseStats, keep_args: bool) -> None:
        kept: list[TraceEvent] = []
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

    def _add_memory(self, kept: list[TraceEvent], which: np.ndarray) -> None:
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

    def _pair(self, e: TraceEvent, stats: ParseStats) -> TraceEvent | None:
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
        return TraceEvent("X", begin.name, begin.cat, begin.ts, e.ts - begin.ts, begin.pid, begin.tid, begin.args)


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
            value = decode_any(raw)
        except (msgspec.DecodeError, RecursionError):
            return {}
        return value if isinstance(value, dict) else {"value": value}

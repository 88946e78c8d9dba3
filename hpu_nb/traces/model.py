"""The loaded trace: columns sorted by track and time, nesting, self time, and the summaries.

Its parts live beside it: tracks.py (the rows), steps.py (ProfilerStep#N), spans.py (nesting arithmetic), memory.py
(the [memory] timeline), dtypes.py (op dtypes), files.py (finding traces); the names stay importable from here.
"""

from __future__ import annotations

import html
import os
import warnings
from typing import Any

import msgspec
import numpy as np

from hpu_nb.traces._parse import PH_COMPLETE, PH_COUNTER, ParsedTrace, parse_file
from hpu_nb.traces.dtypes import DTYPE_KINDS, float_kind
from hpu_nb.traces.files import find_trace, trace_files
from hpu_nb.traces.load_warning import TraceLoadWarning
from hpu_nb.traces.memory import MemoryTimeline
from hpu_nb.traces.spans import nesting, outermost_of_name, union_ns
from hpu_nb.traces.steps import STEP_PATTERN, Step, Steps
from hpu_nb.traces.tables import Table, fmt_ns
from hpu_nb.traces.tracks import Track, make_tracks

__all__ = ["STEP_PATTERN", "MemoryTimeline", "Step", "Steps", "Trace", "TraceLoadWarning", "TraceSummary", "Track",
           "find_trace", "load", "trace_files"]


class Trace:
    """A Chrome trace in columnar form. Times are int64 nanoseconds from the first event."""

    def __init__(self, parsed: ParsedTrace, path: str | None = None) -> None:
        self.path = path
        self.names = parsed.names
        self.cats = parsed.cats
        self.metadata = parsed.top_level
        self.stats = parsed.stats
        self._args = parsed.args
        self._special_args = parsed.special_args
        self._memory = parsed.memory
        n = len(parsed.ts_us)
        self.t0_us = float(parsed.ts_us.min()) if n else 0.0
        ts = np.rint((parsed.ts_us - self.t0_us) * 1000.0).astype(np.int64)
        parsed.ts_us = None  # type: ignore[assignment]  (drop each input column once used: lower peak memory)
        dur = np.rint(np.maximum(parsed.dur_us, 0.0) * 1000.0).astype(np.int64)
        parsed.dur_us = None  # type: ignore[assignment]
        order = np.lexsort((-dur, ts, parsed.track_id))
        self.order = order  # sorted position -> index in file order (for args)
        self.ts = ts[order]
        del ts
        self.dur = dur[order]
        del dur
        self.end = self.ts + self.dur
        self.name_id = parsed.name_id[order]
        self.cat_id = parsed.cat_id[order]
        self.track_id = parsed.track_id[order]
        self.ph = parsed.ph[order]
        parsed.name_id = parsed.cat_id = parsed.track_id = parsed.ph = None  # type: ignore[assignment]
        self.tracks = make_tracks(parsed.tracks, parsed.metadata_events)
        self.track_bounds = np.searchsorted(self.track_id, np.arange(len(self.tracks) + 1))
        self.depth, self.parent, self.self_ns = nesting(self.ph, self.dur, self.end, self.track_id)
        self.steps = self._find_steps()
        self.op_mask = self.is_span & ~self._excluded_mask()  # spans that are ops (not step markers, not the window)
        # spans with no enclosing span of the same name: they count toward op totals
        self.outermost = outermost_of_name(self.is_span, self.parent, self.name_id)

    # -- basics -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.ts)

    @property
    def duration_ns(self) -> int:
        return int(self.end.max()) if len(self) else 0

    @property
    def is_span(self) -> np.ndarray:
        return self.depth >= 0

    @property
    def hpu_nb_info(self) -> dict[str, Any]:
        """What HPUProfiler recorded about the device (e.g. that the Gaudi was emulated)."""
        info = self.metadata.get("hpu_nb")
        if isinstance(info, str):
            try:
                info = msgspec.json.decode(info)
            except msgspec.DecodeError:
                info = {"note": info}
        return info if isinstance(info, dict) else {}

    @property
    def device_note(self) -> str:
        return str(self.hpu_nb_info.get("note", ""))

    def name_ids_matching(self, query: str) -> np.ndarray:
        """Ids of names containing `query` (case-insensitive)."""
        q = query.lower()
        return np.array([i for i, nm in enumerate(self.names) if q in nm.lower()], dtype=np.int64)

    def event(self, i: int) -> dict[str, Any]:
        """Everything known about the event at sorted position `i` (for the viewer's details pane)."""
        if not 0 <= i < len(self):
            raise IndexError(f"event {i} out of range (trace has {len(self)} events)")
        track = self.tracks[int(self.track_id[i])]
        raw_index = int(self.order[i])
        mem = self._memory
        k = int(np.searchsorted(mem.index, raw_index))
        if self._args is not None:
            args = self._args.get(raw_index)
        elif raw_index in self._special_args:
            args = _decode_args(self._special_args[raw_index])
        elif k < len(mem.index) and mem.index[k] == raw_index:
            args = mem.args(k)
        else:
            args = {}
        step = self.step_of(int(self.ts[i]))
        return {
            "index": i,
            "name": self.names[int(self.name_id[i])],
            "category": self.cats[int(self.cat_id[i])],
            "track": track.label,
            "start_us": float(self.ts[i]) / 1000.0,
            "duration_us": float(self.dur[i]) / 1000.0,
            "self_us": float(self.self_ns[i]) / 1000.0,
            "depth": int(self.depth[i]),
            "step": step.number if step else None,
            "args": args,
        }

    def step_of(self, t_ns: int) -> Step | None:
        if not self.steps:
            return None
        starts = np.fromiter((s.start_ns for s in self.steps), np.int64, len(self.steps))
        k = int(np.searchsorted(starts, t_ns, side="right")) - 1
        if k >= 0 and t_ns < self.steps[k].end_ns:
            return self.steps[k]
        return None

    def _find_steps(self) -> Steps:
        numbers = {i: int(m.group(1)) for i, nm in enumerate(self.names) if (m := STEP_PATTERN.match(nm))}
        if not numbers:
            return Steps()
        ids = np.fromiter(numbers, np.int64, len(numbers))
        idx = np.flatnonzero(np.isin(self.name_id, ids) & (self.ph == PH_COMPLETE))
        seen: dict[int, Step] = {}
        for i in idx[np.argsort(self.ts[idx], kind="stable")]:
            num = numbers[int(self.name_id[i])]
            seen.setdefault(num, Step(num, int(self.ts[i]), int(self.end[i])))
        return Steps(sorted(seen.values(), key=lambda s: s.start_ns))

    # -- summaries ----------------------------------------------------------------------------
    def ops(self, by: str = "self", top: int = 20, category: str | None = None) -> Table:
        """Top ops by self or total time (aggregated over every occurrence of a name)."""
        if by not in ("self", "total"):
            raise ValueError(f"by must be 'self' or 'total', not {by!r}")
        mask = self.op_mask.copy()
        if category is not None:
            if category not in self.cats:
                raise ValueError(f"no category {category!r} in this trace; it has: {', '.join(self.cats[1:])}")
            mask &= self.cat_id == self.cats.index(category)
        count, total, self_t = self._aggregate(mask)
        key = self_t if by == "self" else total
        nz = np.flatnonzero(count)
        pick = nz[np.argsort(-key[nz], kind="stable")][:top]
        grand = max(int(self_t.sum()), 1)
        rows = [
            [
                self.names[k],
                int(count[k]),
                int(total[k]),
                int(self_t[k]),
                100.0 * self_t[k] / grand,
                int(total[k] // count[k]),
            ]
            for k in pick
        ]
        return Table(
            f"Top {len(rows)} ops by {by} time" + (f" (category {category})" if category else "") + _note_suffix(self),
            ["name", "calls", "total", "self", "self %", "avg"],
            rows,
            {"total": fmt_ns, "self": fmt_ns, "avg": fmt_ns, "self %": lambda v: f"{v:.1f}%"},
        )

    def op_totals(self) -> dict[str, tuple[int, int, int]]:
        """name -> (calls, total ns, self ns), over all spans except ProfilerStep#N."""
        count, total, self_t = self._aggregate(self.op_mask)
        return {self.names[k]: (int(count[k]), int(total[k]), int(self_t[k])) for k in np.flatnonzero(count)}

    def _aggregate(self, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per name id: calls, total time and self time of the spans in `mask`.

        A span inside another span of the same name (recursion, a wrapper calling the op of the same name) is a
        call, but its time is already in the outer one's total: total time counts outermost spans only, so an op's
        total never exceeds the time it was on the stack.
        """
        n = len(self.names)
        ids = self.name_id[mask]
        count = np.bincount(ids, minlength=n)
        total = np.bincount(ids, weights=np.where(self.outermost[mask], self.dur[mask], 0), minlength=n)
        self_t = np.bincount(ids, weights=self.self_ns[mask], minlength=n)
        return count, total.astype(np.int64), self_t.astype(np.int64)

    def _excluded_mask(self) -> np.ndarray:
        """Spans that are not ops: ProfilerStep#N markers and the profiler's own whole-window span."""
        ids = [i for i, nm in enumerate(self.names) if STEP_PATTERN.match(nm)]
        mask = np.isin(self.name_id, ids) if ids else np.zeros(len(self), bool)
        if "Trace" in self.cats:
            mask |= self.cat_id == self.cats.index("Trace")
        return mask

    def per_step(self) -> Table:
        """Each ProfilerStep#N: its duration, how many ops ran in it, and its heaviest op by self time."""
        rows = []
        if self.steps:
            idx = np.flatnonzero(self.op_mask)
            starts = np.array([s.start_ns for s in self.steps])
            ends = np.array([s.end_ns for s in self.steps])
            k = np.searchsorted(starts, self.ts[idx], side="right") - 1
            inside = (k >= 0) & (self.ts[idx] < ends[np.maximum(k, 0)])
            idx, k = idx[inside], k[inside]
            n_steps, n_names = len(self.steps), max(len(self.names), 1)
            ops = np.bincount(k, minlength=n_steps)
            keys, inv = np.unique(k.astype(np.int64) * n_names + self.name_id[idx], return_inverse=True)
            sums = np.bincount(inv, weights=self.self_ns[idx])
            step_of = keys // n_names
            best = np.lexsort((-sums, step_of))
            first = best[np.r_[True, step_of[best][1:] != step_of[best][:-1]]] if len(best) else best
            top = {int(step_of[j]): f"{self.names[int(keys[j] % n_names)]} ({fmt_ns(sums[j])})" for j in first}
            for j, step in enumerate(self.steps):
                rows.append([step.number, step.start_ns, step.duration_ns, int(ops[j]), top.get(j, "-")])
        return Table(
            f"Steps ({len(rows)})" + _note_suffix(self),
            ["step", "start", "duration", "ops", "top op by self time"],
            rows,
            {"start": fmt_ns, "duration": fmt_ns},
        )

    def visible_tracks(self) -> list[Track]:
        """Tracks with at least one op span, in display order (metadata-only and instant-only tracks are hidden)."""
        has_ops = np.bincount(self.track_id[self.op_mask], minlength=len(self.tracks)) > 0
        return [t for t in sorted(self.tracks, key=lambda t: t.sort_key) if has_ops[t.index]]

    def per_track(self) -> Table:
        """Each thread / device track: op spans, busy time (the union of their intervals) and its share of the trace."""
        rows = []
        span = max(self.duration_ns, 1)
        visible = self.visible_tracks()
        for t in visible:
            lo, hi = self.track_bounds[t.index], self.track_bounds[t.index + 1]
            ops = self.op_mask[lo:hi]
            busy = union_ns(self.ts[lo:hi][ops], self.end[lo:hi][ops])
            rows.append([t.label, t.kind, int(ops.sum()), busy, 100.0 * busy / span])
        hidden = len(self.tracks) - len(visible)
        return Table(
            "Tracks" + _note_suffix(self),
            ["track", "kind", "ops", "busy", "busy %"],
            rows,
            {"busy": fmt_ns, "busy %": lambda v: f"{v:.1f}%"},
            note=f"busy = time covered by at least one op span; {hidden} track(s) without op spans hidden"
            if hidden else "busy = time covered by at least one op span",
        )

    def idle_gaps(self, top: int = 10, min_ns: int = 1000, kind: str | None = None) -> Table:
        """The longest gaps between consecutive top-level spans on each track (where the device or thread waited)."""
        found = []
        for t in self.visible_tracks():
            if kind is not None and t.kind != kind:
                continue
            lo, hi = self.track_bounds[t.index], self.track_bounds[t.index + 1]
            idx = lo + np.flatnonzero(self.op_mask[lo:hi])
            if len(idx) < 2:
                continue
            run_end = np.maximum.accumulate(self.end[idx])
            gaps = self.ts[idx[1:]] - run_end[:-1]
            big = np.flatnonzero(gaps >= min_ns)
            for g in big[np.argsort(-gaps[big])][:top]:
                found.append(
                    [
                        int(gaps[g]),
                        t.label,
                        int(run_end[g]),
                        self.names[int(self.name_id[idx[g]])],
                        self.names[int(self.name_id[idx[g + 1]])],
                    ]
                )
        found.sort(key=lambda r: -r[0])
        title = (f"Idle gaps: the {min(top, len(found))} longest of at least {fmt_ns(min_ns)}" if found
                 else f"Idle gaps: none of at least {fmt_ns(min_ns)}")
        return Table(
            title,
            ["gap", "track", "at", "after", "before"],
            found[:top],
            {"gap": fmt_ns, "at": fmt_ns},
        )

    def dtypes(self, top: int = 20) -> Table:
        """Which ops ran in which floating dtype (from "Input type", recorded with record_shapes=True): under
        autocast, the ops that really ran in bf16 / fp16. A call counts under the lowest float type among its inputs.
        """
        counts: dict[str, dict[str, int]] = {}
        if self._args is not None:
            for i in np.flatnonzero(self.op_mask):
                types = self._args.get(int(self.order[i])).get("Input type")
                if not isinstance(types, list):
                    continue
                kind = float_kind(types)
                if kind is not None:
                    row = counts.setdefault(self.names[int(self.name_id[i])], dict.fromkeys(DTYPE_KINDS, 0))
                    row[kind] += 1
        rows = [[name, sum(c.values())] + [c[k] for k in DTYPE_KINDS] for name, c in counts.items()]
        rows.sort(key=lambda r: (-(r[2] + r[3] + r[4]), -r[1], r[0]))
        low = sum(r[2] + r[3] + r[4] for r in rows)
        note = (f"{low:,} of {sum(r[1] for r in rows):,} calls with float inputs ran in a low precision"
                if rows else "no input types in this trace: profile with record_shapes=True to record them")
        return Table("Op dtypes (calls by the lowest float type of their inputs)" + _note_suffix(self),
                     ["name", "calls", *DTYPE_KINDS], rows[:top], note=note)

    def memory(self) -> MemoryTimeline:
        """Allocated / reserved bytes over time from the profiler's [memory] events, per device."""
        mem = self._memory
        ts = np.rint((mem.ts_us - self.t0_us) * 1000.0).astype(np.int64)
        order = np.argsort(ts, kind="stable")
        series = {}
        for d, label in enumerate(mem.devices):
            pick = order[mem.device[order] == d]
            series[label] = np.stack([ts[pick], mem.allocated[pick], mem.reserved[pick]], axis=1)
        return MemoryTimeline(series, note=self.device_note)

    def counters(self) -> dict[str, np.ndarray]:
        """Counter ("C") events: name -> array of (t_ns, value) for their first numeric series."""
        out: dict[str, list[tuple[int, float]]] = {}
        for i in np.flatnonzero(self.ph == PH_COUNTER):
            args = _decode_args(self._special_args.get(int(self.order[i]), b""))
            for key, value in args.items():
                if isinstance(value, (int, float)):
                    out.setdefault(f"{self.names[int(self.name_id[i])]}.{key}", []).append((int(self.ts[i]), value))
        return {k: np.array(v) for k, v in out.items()}

    def summary(self, top: int = 15) -> TraceSummary:
        """Top ops by self and total time, steps, tracks, idle gaps and memory in one object."""
        return TraceSummary(self, top)

    def __repr__(self) -> str:
        where = os.path.basename(self.path) if self.path else "trace"
        note = f", {self.device_note}" if self.device_note else ""
        return (
            f"<Trace {where}: {len(self):,} events, {len(self.tracks)} tracks, {len(self.steps)} steps, "
            f"{fmt_ns(self.duration_ns)}{note}>"
        )


class TraceSummary:
    """The summary of one trace: top ops by self and total time, steps, tracks, gaps, memory."""

    def __init__(self, trace: Trace, top: int = 15) -> None:
        self.trace = trace
        self.by_self = trace.ops("self", top)
        self.by_total = trace.ops("total", top)
        self.steps = trace.per_step()
        self.tracks = trace.per_track()
        self.gaps = trace.idle_gaps(top=min(top, 10))
        self.memory = trace.memory()
        self.dtypes = trace.dtypes(top)

    def _parts(self) -> list[Any]:
        parts = [self.by_self, self.by_total, self.steps, self.tracks, self.gaps, self.memory]
        return parts + [self.dtypes] if len(self.dtypes) else parts

    def _header(self) -> str:
        return repr(self.trace) + _load_note(self.trace)

    def __repr__(self) -> str:
        return "\n\n".join([self._header()] + [repr(p) for p in self._parts()])

    def _repr_html_(self) -> str:
        body = "".join(f"<div style='margin:6px 0'>{p._repr_html_()}</div>" for p in self._parts())
        return f"<div class='hpu-nb-trace-summary'><pre>{html.escape(self._header())}</pre>{body}</div>"


def _load_note(trace: Trace) -> str:
    s = trace.stats
    notes = []
    if s.gzip_error is not None:
        notes.append("corrupt gzip data: the rest of the file was not read")
    elif s.stopped is not None:
        notes.append("an event too large to read: the rest of the file was not read")
    elif s.truncated:
        notes.append(f"truncated file: {s.dropped_bytes:,} trailing bytes dropped")
    if s.malformed:
        notes.append(f"{s.malformed:,} malformed events skipped")
    return ("\n(" + "; ".join(notes) + ")") if notes else ""


def _note_suffix(trace: Trace) -> str:
    """' (emulated Gaudi, CPU activity only)' on every table of a trace recorded on the emulated Gaudi."""
    return f" ({trace.device_note})" if trace.device_note else ""


def _decode_args(raw: bytes) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        value = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def load(path: str | os.PathLike, keep_args: bool = True) -> Trace:
    """Load a Chrome-trace JSON (.json or .json.gz) file, or the newest trace in a folder.

    A file cut short loads what it can, with a TraceLoadWarning saying how much was lost;
    malformed events are skipped and counted (``trace.stats``). ``keep_args=False`` saves the
    memory of the events' args (the viewer then shows no args on click).
    """
    target = find_trace(path)
    parsed = parse_file(target, keep_args=keep_args)
    trace = Trace(parsed, target)
    s = parsed.stats
    if s.truncated and s.gzip_error is None and s.stopped is None:  # those two have warnings of their own
        warnings.warn(
            f"{target}: the trace ends early (a crashed or interrupted run?): loaded {len(trace):,} complete "
            f"events from {s.bytes_read:,} bytes; {s.dropped_bytes:,} trailing bytes held no complete event "
            "and were dropped.",
            TraceLoadWarning,
            stacklevel=2,
        )
    if s.malformed:
        ex = "; ".join(s.examples)
        warnings.warn(
            f"{target}: skipped {s.malformed:,} malformed events (kept {len(trace):,}). For example: {ex}",
            TraceLoadWarning,
            stacklevel=2,
        )
    return trace

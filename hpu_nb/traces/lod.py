"""Level of detail for timeline views: only what a view of W pixels can show, in a bounded payload.

A view is a time window drawn `width` pixels wide. Per row (a track at one nesting depth),
spans at least `min_px` wide are sent one by one; narrower spans are merged per pixel column
into one block (with a count, coloured by its longest span). Each row then holds at most about
`1.5 x width` items, so
the payload is bounded by rows x width whatever the trace size; a global item cap coarsens the
resolution further when there are very many rows. Names are sent only for the spans shown one
by one. The payload is a few packed numpy columns (bytes) plus a small JSON-able dict.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpu_nb.traces.model import Trace

MAX_DEPTH = 24  # deeper nesting is not drawn (it is still in the summaries)
MAX_ITEMS = 72_000  # hard cap on items per view: 23 bytes each -> about 1.7 MB at most
MAX_NAME = 120  # characters of a name sent for drawing (details on click send the whole name)
ITEM_BYTES = 23  # x0 f4, x1 f4, dur f4 (the whole span's ns, not only the part in view), name i4, ref i4, row u2, u1

FLAG_MERGED = 1  # a block of several sub-pixel spans; `ref` holds how many, `name` its longest span's name
FLAG_MATCH = 2  # the span (or one in the block) matches the search


@dataclass(frozen=True)
class Row:
    track: int
    depth: int
    label: str
    kind: str


@dataclass
class ViewPayload:
    """What one view needs: packed item columns (`data`) and a small JSON-able description (`meta`)."""

    data: bytes
    meta: dict[str, Any]

    @property
    def nbytes(self) -> int:
        """Bytes on the wire: the binary columns plus the JSON of the metadata (names included)."""
        return len(self.data) + len(json.dumps(self.meta))

    def __repr__(self) -> str:
        m = self.meta
        return (
            f"<ViewPayload {m['n']:,} items ({m['merged']:,} merged blocks) for {m['spans_in_view']:,} spans, "
            f"{self.nbytes:,} bytes, window {m['t0']:.0f}..{m['t1']:.0f} ns at {m['width']} px>"
        )

    def columns(self) -> dict[str, np.ndarray]:
        """Unpack `data` (the same layout the JavaScript reads)."""
        n = self.meta["n"]
        buf = memoryview(self.data)
        out, off = {}, 0
        for key, dtype in (
            ("x0", "<f4"),
            ("x1", "<f4"),
            ("dur", "<f4"),
            ("name", "<i4"),
            ("ref", "<i4"),
            ("row", "<u2"),
            ("flags", "u1"),
        ):
            size = np.dtype(dtype).itemsize * n
            out[key] = np.frombuffer(buf[off : off + size], dtype=dtype)
            off += size
        return out


class TimelineIndex:
    """Per-row sorted positions of a trace's spans, built once, queried per view."""

    def __init__(self, trace: Trace, max_depth: int = MAX_DEPTH) -> None:
        self.trace = trace
        self.rows: list[Row] = []
        self._pos: list[np.ndarray] = []
        self._cummax_end: list[np.ndarray] = []
        depth = trace.depth
        for track in trace.visible_tracks():  # tracks without op spans (metadata, the profiler's window) are hidden
            lo, hi = int(trace.track_bounds[track.index]), int(trace.track_bounds[track.index + 1])
            d = depth[lo:hi]
            if not (d >= 0).any():
                continue
            for level in range(min(int(d.max()), max_depth - 1) + 1):
                pos = lo + np.flatnonzero(d == level)  # already in time order (sorted by track, ts)
                if not len(pos):
                    continue
                self.rows.append(Row(track.index, level, track.label, track.kind))
                self._pos.append(pos)
                self._cummax_end.append(np.maximum.accumulate(trace.end[pos]))

    def row_meta(self) -> list[dict[str, Any]]:
        return [{"track": r.track, "depth": r.depth, "label": r.label, "kind": r.kind} for r in self.rows]

    def view(
        self,
        t0: float,
        t1: float,
        width: int,
        match_ids: np.ndarray | None = None,
        min_px: float = 2.0,
        max_items: int = MAX_ITEMS,
    ) -> ViewPayload:
        """The items to draw for the window [t0, t1) ns at `width` px (search matches flagged)."""
        width = int(max(50, min(int(width), 8192)))
        t0, t1 = float(t0), float(t1)
        if not t1 > t0:
            raise ValueError(f"empty view window: [{t0}, {t1}]")
        resolution = 1.0
        while True:
            parts = self._collect(t0, t1, width, match_ids, min_px * resolution, resolution)
            n = sum(len(p[0]) for p in parts)
            if n <= max_items or resolution > width:
                break
            resolution *= 2  # too many rows x pixels: coarsen until the payload fits
        return self._pack(parts, t0, t1, width, resolution)

    def _collect(self, t0, t1, width, match_ids, min_px, merge_px):
        tr = self.trace
        ns_per_px = (t1 - t0) / width
        parts = []
        for r, pos in enumerate(self._pos):
            hi = int(np.searchsorted(tr.ts[pos], t1, side="left"))
            lo = int(np.searchsorted(self._cummax_end[r], t0, side="right"))
            if hi <= lo:
                continue
            sel = pos[lo:hi]
            sel = sel[tr.end[sel] > t0]
            if not len(sel):
                continue
            x0 = (np.maximum(tr.ts[sel], t0) - t0) / ns_per_px
            x1 = (np.minimum(tr.end[sel], t1) - t0) / ns_per_px
            wide = (x1 - x0) >= min_px
            match = np.isin(tr.name_id[sel], match_ids) if match_ids is not None and len(match_ids) else None
            w = np.flatnonzero(wide)
            items_x0, items_x1, items_dur = [x0[w]], [x1[w]], [tr.dur[sel[w]]]
            items_name, items_ref = [tr.name_id[sel[w]].astype(np.int32)], [sel[w].astype(np.int32)]
            items_flags = [
                np.where(match[w], FLAG_MATCH, 0).astype(np.uint8) if match is not None else np.zeros(len(w), np.uint8)
            ]
            nw = np.flatnonzero(~wide)
            if len(nw):
                # narrow spans: one block per occupied pixel column, named after its longest span
                a, b = x0[nw], x1[nw]
                bucket = np.floor(a / merge_px).astype(np.int64)
                starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
                bx0 = a[starts]
                bx1 = np.maximum(np.maximum.reduceat(b, starts), bx0 + min(1.0, merge_px))
                count = np.diff(np.r_[starts, len(a)]).astype(np.int32)
                order = np.lexsort((-tr.dur[sel[nw]], bucket))
                longest = sel[nw[order[starts]]]  # groups are contiguous and in the same order after the sort
                single = count == 1
                items_x0.append(bx0)
                items_x1.append(bx1)
                items_dur.append(tr.dur[longest])
                items_name.append(tr.name_id[longest].astype(np.int32))
                # a block of one span is that span: its index lets a click show its details
                items_ref.append(np.where(single, longest, count).astype(np.int32))
                flags = np.where(single, 0, FLAG_MERGED).astype(np.uint8)
                if match is not None:
                    hit = np.maximum.reduceat(match[nw].astype(np.uint8), starts) > 0
                    flags |= np.where(hit, FLAG_MATCH, 0).astype(np.uint8)
                items_flags.append(flags)
            parts.append(
                (
                    np.concatenate(items_x0).astype(np.float32),
                    np.concatenate(items_x1).astype(np.float32),
                    np.concatenate(items_dur).astype(np.float32),
                    np.concatenate(items_name),
                    np.concatenate(items_ref),
                    np.full(sum(len(x) for x in items_x0), r, np.uint16),
                    np.concatenate(items_flags),
                )
            )
        return parts

    def _pack(self, parts, t0, t1, width, resolution) -> ViewPayload:
        cols = [
            np.concatenate([p[k] for p in parts]) if parts else np.empty(0, dt)
            for k, dt in enumerate((np.float32, np.float32, np.float32, np.int32, np.int32, np.uint16, np.uint8))
        ]
        x0, name, ref, flags = cols[0], cols[3], cols[4], cols[6]
        ids = np.unique(name[name >= 0])
        names = {int(i): _clip(self.trace.names[int(i)]) for i in ids}
        data = b"".join(c.astype(dt).tobytes() for c, dt in zip(cols, ("<f4", "<f4", "<f4", "<i4", "<i4", "<u2", "u1")))
        meta = {
            "n": len(x0),
            "t0": t0,
            "t1": t1,
            "width": width,
            "resolution_px": resolution,
            "names": {str(k): v for k, v in names.items()},
            "merged": int((flags & FLAG_MERGED).astype(bool).sum()),
            "spans_in_view": int(np.where(flags & FLAG_MERGED, ref, 1).sum()) if len(ref) else 0,
        }
        return ViewPayload(data, meta)


def _clip(name: str) -> str:
    return name if len(name) <= MAX_NAME else name[: MAX_NAME - 1] + "…"

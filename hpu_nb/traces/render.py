"""A small static picture of a trace's timeline (inline SVG), for outputs without a live front end."""

from __future__ import annotations

import html
import zlib

import numpy as np

from hpu_nb.traces.lod import FLAG_MATCH, FLAG_MERGED, TimelineIndex
from hpu_nb.traces.model import Trace
from hpu_nb.traces.tables import fmt_ns

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7", "#9c755f", "#e15759", "#bab0ac")
MERGED_COLOUR = "#999999"


def colour(name: str) -> str:
    return PALETTE[zlib.crc32(name.encode("utf-8", "replace")) % len(PALETTE)]


def timeline_svg(
    trace: Trace,
    index: TimelineIndex | None = None,
    window: tuple[float, float] | None = None,
    width: int = 720,
    row_height: int = 12,
    max_rows: int = 24,
    max_items: int = 3000,
) -> str:
    """The timeline as inline SVG: one band per (track, depth) row, sub-pixel spans merged, names escaped."""
    index = index or TimelineIndex(trace)
    label_w = 160
    plot_w = width - label_w
    t0, t1 = window or (0.0, float(max(trace.duration_ns, 1)))
    rows = index.rows[:max_rows]
    height = row_height * len(rows) + 18
    out = [
        (
            f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
            f"font-family='sans-serif' font-size='9' role='img'>"
        ),
        f"<title>{html.escape(_caption(trace, t0, t1))}</title>",
    ]
    if rows:
        payload = index.view(t0, t1, plot_w, min_px=2.0, max_items=max_items)
        cols = payload.columns()
        names = payload.meta["names"]
        keep = cols["row"] < len(rows)
        for x0, x1, nid, row, flags in zip(
            cols["x0"][keep], cols["x1"][keep], cols["name"][keep], cols["row"][keep], cols["flags"][keep]
        ):
            merged = bool(flags & FLAG_MERGED)
            fill = MERGED_COLOUR if merged or nid < 0 else colour(names.get(str(int(nid)), ""))
            stroke = " stroke='#d00'" if flags & FLAG_MATCH else ""
            out.append(
                f"<rect x='{label_w + x0:.1f}' y='{int(row) * row_height + 1}' width='{max(x1 - x0, 0.5):.1f}' "
                f"height='{row_height - 2}' fill='{fill}'{stroke}/>"
            )
        last = None
        for r, row in enumerate(rows):
            if row.track != last:
                out.append(f"<text x='2' y='{r * row_height + row_height - 3}'>{html.escape(row.label[:30])}</text>")
                last = row.track
    ticks = np.linspace(t0, t1, 5)
    for k, t in enumerate(ticks):
        x = label_w + plot_w * k / 4
        anchor = "start" if k == 0 else "end" if k == 4 else "middle"
        out.append(f"<text x='{x:.0f}' y='{height - 4}' text-anchor='{anchor}' fill='#555'>{fmt_ns(t)}</text>")
    if len(index.rows) > max_rows:
        out.append(
            f"<text x='{width - 2}' y='10' text-anchor='end' fill='#555'>+{len(index.rows) - max_rows} rows</text>"
        )
    out.append("</svg>")
    return "".join(out)


def _caption(trace: Trace, t0: float, t1: float) -> str:
    return f"timeline {fmt_ns(t0)} to {fmt_ns(t1)} of {len(trace):,} events"

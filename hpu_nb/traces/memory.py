"""Memory in use over time per device, from the profiler's [memory] events: table and a small SVG line chart."""

from __future__ import annotations

import html

import numpy as np

from hpu_nb.traces.tables import Table, fmt_bytes


class MemoryTimeline:
    """Memory in use over time per device, from the profiler's [memory] events."""

    def __init__(self, series: dict[str, np.ndarray], note: str = "") -> None:
        self.series = series  # device -> rows of (t_ns, allocated, reserved)
        self.note = note  # what the trace says about its device (e.g. that the Gaudi was emulated)

    def __len__(self) -> int:
        return sum(len(v) for v in self.series.values())

    def peak(self, device: str | None = None) -> int:
        keys = [device] if device else list(self.series)
        return max((int(self.series[k][:, 1].max()) for k in keys if len(self.series[k])), default=0)

    def table(self) -> Table:
        rows = [
            [dev, len(s), int(s[:, 1].max()), int(s[-1, 1]), int(s[:, 2].max())]
            for dev, s in self.series.items()
            if len(s)
        ]
        return Table(
            "Memory ([memory] events)" + (f" ({self.note})" if self.note else ""),
            ["device", "events", "peak allocated", "final allocated", "peak reserved"],
            rows,
            {"peak allocated": fmt_bytes, "final allocated": fmt_bytes, "peak reserved": fmt_bytes},
            note="" if rows else "no [memory] events: profile with profile_memory=True to record them",
        )

    def svg(self, width: int = 420, height: int = 110) -> str:
        """A small line chart of allocated bytes over time (one line per device), as inline SVG, with its axes: bytes
        (0 and the peak) on the left, milliseconds since the trace's first event below, a title and the devices."""
        left, right, top, bottom = 64, 8, 16, 18
        w, h = width - left - right, height - top - bottom
        parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' font-family='sans-serif'"
                 " font-size='10'>",
                 f"<text x='{left}' y='11' fill='#555'>allocated memory over time</text>",
                 f"<rect x='{left}' y='{top}' width='{w}' height='{h}' fill='none' stroke='#ddd'/>"]
        colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
        starts = [int(s[0, 0]) for s in self.series.values() if len(s)]
        t0 = min(starts, default=0)
        t_max = max((int(s[-1, 0]) - t0 for s in self.series.values() if len(s)), default=1) or 1
        peak = max(self.peak(), 1)
        for y, label in ((top + h, "0 B"), (top, fmt_bytes(peak))):
            parts.append(f"<text x='{left - 4}' y='{y + 3}' text-anchor='end'>{html.escape(label)}</text>")
        parts.append(f"<text x='{left}' y='{height - 4}'>0 ms</text>")
        parts.append(f"<text x='{left + w}' y='{height - 4}' text-anchor='end'>{t_max / 1e6:.3g} ms</text>")
        for c, (dev, s) in enumerate(self.series.items()):
            if not len(s):
                continue
            step = max(1, len(s) // w)
            pts = " ".join(
                f"{left + w * (t - t0) / t_max:.1f},{top + h * (1 - a / peak):.1f}" for t, a, _ in s[::step]
            )
            parts.append(
                f"<polyline fill='none' stroke='{colours[c % 4]}' points='{pts}'>"
                f"<title>{html.escape(dev)}</title></polyline>"
                f"<text x='{left + w - 4}' y='{top + 12 + 11 * c}' text-anchor='end' fill='{colours[c % 4]}'>"
                f"{html.escape(dev)}</text>"
            )
        parts.append("</svg>")
        return "".join(parts)

    def __repr__(self) -> str:
        return repr(self.table())

    def _repr_html_(self) -> str:
        return self.table()._repr_html_() + (self.svg() if len(self) else "")

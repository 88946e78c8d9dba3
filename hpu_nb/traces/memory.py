"""Memory in use over time per device, from the profiler's [memory] events: table and a tiny SVG line chart."""

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

    def svg(self, width: int = 360, height: int = 60) -> str:
        """A tiny line chart of allocated bytes (one line per device), as inline SVG."""
        parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}'>"]
        colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
        t_max = max((int(s[-1, 0]) for s in self.series.values() if len(s)), default=1) or 1
        peak = max(self.peak(), 1)
        for c, (dev, s) in enumerate(self.series.items()):
            if not len(s):
                continue
            step = max(1, len(s) // width)
            pts = " ".join(
                f"{width * t / t_max:.1f},{height - 2 - (height - 4) * a / peak:.1f}" for t, a, _ in s[::step]
            )
            parts.append(
                f"<polyline fill='none' stroke='{colours[c % 4]}' points='{pts}'>"
                f"<title>{html.escape(dev)}</title></polyline>"
            )
        parts.append("</svg>")
        return "".join(parts)

    def __repr__(self) -> str:
        return repr(self.table())

    def _repr_html_(self) -> str:
        return self.table()._repr_html_() + (self.svg() if len(self) else "")

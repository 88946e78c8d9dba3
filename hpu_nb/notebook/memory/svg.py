"""The frame and lines of one static SVG chart over the batch axis (the summary's pictures: no JavaScript)."""

from __future__ import annotations

import html
import math

from hpu_nb.notebook.memory.history import EPOCH, X

# Each rank's InUse line: colour, width, dash, opacity (the live chart's RANK_STYLES in static/training_chart.js are the
# same). Rank 0 is a wide pale band under the lines, the others narrow dashed lines over it: ranks with the same
# memory still read as two series (a dashed line inside a band), not as one line.
RANK_STYLES = (
    ("#17becf", 8.0, "", 0.4),
    ("#8c564b", 1.8, "6,3", 1.0),
    ("#e377c2", 1.8, "2,2", 1.0),
    ("#7f7f7f", 1.8, "8,2,2,2", 1.0),
    ("#bcbd22", 1.8, "1,3", 1.0),
)


def rank_style(rank: int) -> tuple[str, float, str, float]:
    """Colour, width, dash and opacity of rank `rank`'s line (the styles repeat after the fifth rank)."""
    return RANK_STYLES[0] if rank == 0 else RANK_STYLES[1 + (rank - 1) % (len(RANK_STYLES) - 1)]


class SvgPlot:
    """Coordinates and frame of one static SVG chart over the batch axis."""

    left, right, top, bottom = 70, 10, 22, 22  # the title sits above the plotting area (`frame(label=...)`)

    def __init__(self, points: list[list[float]], width: int, height: int, ymax: float, x_extra: float,
                 ymin: float = 0.0) -> None:
        self.points, self.width, self.height, self.ymax, self.ymin = points, width, height, ymax, ymin
        self.w, self.h = width - self.left - self.right, height - self.top - self.bottom
        self.x0 = points[0][X]
        self.x1 = max(points[-1][X], x_extra, self.x0 + 1)

    def sx(self, x: float) -> float:
        return self.left + self.w * (x - self.x0) / (self.x1 - self.x0)

    def sy(self, y: float) -> float:
        return self.top + self.h * (1 - (y - self.ymin) / (self.ymax - self.ymin))

    def frame(self, ticks: list[tuple[float, str]], label: str = "") -> list[str]:
        parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{self.height}" '
                 f'font-family="sans-serif" font-size="10">',
                 f'<rect x="{self.left}" y="{self.top}" width="{self.w}" height="{self.h}" fill="#fafafa" '
                 'stroke="#ddd"/>']
        for y, text in ticks:
            parts.append(f'<text x="{self.left - 4}" y="{self.sy(y) + 3:.1f}" text-anchor="end">{html.escape(text)}'
                         "</text>")
        if label:
            parts.append(f'<text x="{self.left}" y="{self.top - 6}" fill="#555">{label}</text>')
        parts.append(f'<text x="{self.left}" y="{self.height - 6}">batch {self.x0:g}</text>')
        parts.append(f'<text x="{self.left + self.w}" y="{self.height - 6}" text-anchor="end">{self.x1:g}</text>')
        for a, b in zip(self.points, self.points[1:]):
            if b[EPOCH] != a[EPOCH]:
                x = self.sx(b[X])
                parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{self.top}" y2="{self.top + self.h}" '
                             'stroke="#999" stroke-dasharray="2,3"/>')
        return parts

    def line(self, column: int, colour: str, dash: str = "") -> str:
        pts = " ".join(f"{self.sx(p[X]):.1f},{self.sy(p[column]):.1f}" for p in self.points
                       if math.isfinite(p[column]))
        return f'<polyline fill="none" stroke="{colour}" stroke-width="1.6" {dash} points="{pts}"/>'


    def rank_line(self, rank: int, xs: list[float], values: list[float]) -> str:
        """Rank `rank`'s InUse at the gathered batches `xs` (its own style, see RANK_STYLES)."""
        colour, width, dash, opacity = rank_style(rank)
        pts = " ".join(f"{self.sx(x):.1f},{self.sy(v):.1f}" for x, v in zip(xs, values, strict=True)
                       if math.isfinite(v))
        dashed = f' stroke-dasharray="{dash}"' if dash else ""
        return (f'<polyline data-series="rank{rank}" fill="none" stroke="{colour}" stroke-width="{width:g}" '
                f'stroke-opacity="{opacity:g}" stroke-linejoin="round"{dashed} points="{pts}"/>')

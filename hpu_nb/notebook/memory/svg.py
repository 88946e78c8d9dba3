"""The frame and lines of one static SVG chart over the batch axis (the summary's pictures: no JavaScript)."""

from __future__ import annotations

import html
import math

from hpu_nb.notebook.memory.history import EPOCH, X


class SvgPlot:
    """Coordinates and frame of one static SVG chart over the batch axis."""

    left, right, top, bottom = 70, 10, 10, 22

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
            parts.append(f'<text x="{self.left + 4}" y="{self.top + 11}" fill="#555">{label}</text>')
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

"""Result tables: plain text for terminals and logs, escaped HTML for notebooks.

Every string that came from a trace (op names, thread names) is data: the HTML form escapes
it, so a hostile name like ``<img src=x onerror=...>`` shows as text and never runs.
"""

from __future__ import annotations

import html
from collections.abc import Iterator, Sequence
from typing import Any


def fmt_ns(ns: float) -> str:
    """A duration in nanoseconds as a short human string (3 significant figures)."""
    ns = float(ns)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if abs(ns) >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.0f} ns"


def fmt_bytes(n: float) -> str:
    n = float(n)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


class Table:
    """Rows of values with named columns and per-column formatters."""

    def __init__(
        self,
        title: str,
        columns: Sequence[str],
        rows: Sequence[Sequence[Any]],
        formats: dict[str, Any] | None = None,
        note: str = "",
        max_rows: int = 25,
    ) -> None:
        self.title = title
        self.columns = list(columns)
        self.rows = [list(r) for r in rows]
        self.formats = formats or {}
        self.note = note
        self.max_rows = max_rows  # longer tables show their head and tail only

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for row in self.rows:
            yield dict(zip(self.columns, row))

    def __getitem__(self, index: int) -> dict[str, Any]:
        return dict(zip(self.columns, self.rows[index]))

    def column(self, name: str) -> list[Any]:
        i = self.columns.index(name)
        return [row[i] for row in self.rows]

    def _shown(self) -> tuple[list[list[Any]], int]:
        """The rows to display and how many were left out in the middle."""
        if len(self.rows) <= self.max_rows:
            return self.rows, 0
        head = self.max_rows - 5
        return self.rows[:head] + self.rows[-5:], len(self.rows) - self.max_rows

    def _cells(self, width: int | None = None) -> list[list[str]]:
        out = []
        for row in self._shown()[0]:
            cells = []
            for col, value in zip(self.columns, row):
                fmt = self.formats.get(col)
                text = fmt(value) if fmt else (f"{value:.3g}" if isinstance(value, float) else str(value))
                cells.append(shorten(text, width) if width else text)
            out.append(cells)
        return out

    def __repr__(self) -> str:
        cells = self._cells(width=60)
        widths = [len(c) for c in self.columns]
        for row in cells:
            widths = [max(w, len(c)) for w, c in zip(widths, row)]
        lines = [self.title]
        lines.append("  ".join(c.ljust(w) for c, w in zip(self.columns, widths)).rstrip())
        hidden = self._shown()[1]
        for k, row in enumerate(cells):
            if hidden and k == self.max_rows - 5:
                lines.append(f"... {hidden:,} more rows ...")
            lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if not self.rows:
            lines.append("(none)")
        if self.note:
            lines.append(self.note)
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        esc = html.escape
        head = "".join(f"<th style='text-align:left'>{esc(c)}</th>" for c in self.columns)
        rows_html = ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in self._cells(width=80)]
        hidden = self._shown()[1]
        if hidden:
            gap = f"<tr><td colspan='{len(self.columns)}'>… {hidden:,} more rows …</td></tr>"
            rows_html.insert(self.max_rows - 5, gap)
        body = "".join(rows_html)
        if not self.rows:
            body = f"<tr><td colspan='{len(self.columns)}'>(none)</td></tr>"
        note = f"<div style='color:#666'>{esc(self.note)}</div>" if self.note else ""
        return (
            f"<div class='hpu-nb-table'><b>{esc(self.title)}</b>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{note}</div>"
        )

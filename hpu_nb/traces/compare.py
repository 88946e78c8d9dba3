"""Two traces side by side: which ops got slower (per step when both traces have steps)."""

from __future__ import annotations

import html

from hpu_nb.traces.model import Trace, load
from hpu_nb.traces.tables import Table, fmt_ns


class Comparison:
    """Per-op self time in trace A vs trace B, largest slow-down first."""

    def __init__(self, a: Trace, b: Trace, top: int = 20, labels: tuple[str, str] = ("A", "B")) -> None:
        self.a, self.b, self.labels = a, b, labels
        # Normalise per step when both traces have ProfilerStep spans, so runs of different lengths compare.
        self.per_step = bool(a.steps) and bool(b.steps)
        na = len(a.steps) if self.per_step else 1
        nb = len(b.steps) if self.per_step else 1
        ta, tb = a.op_totals(), b.op_totals()
        rows = []
        for name in set(ta) | set(tb):
            ca, _, sa = ta.get(name, (0, 0, 0))
            cb, _, sb = tb.get(name, (0, 0, 0))
            va, vb = sa / na, sb / nb
            ratio = (vb / va) if va else float("inf")
            rows.append([name, va, vb, vb - va, ratio, ca / na, cb / nb])
        rows.sort(key=lambda r: -r[3])
        self.rows = rows
        self.step_a = _mean_step(a)
        self.step_b = _mean_step(b)
        la, lb = labels
        unit = "per step" if self.per_step else "whole trace"
        note = f" ({self.device_note})" if self.device_note else ""
        self.table = Table(
            f"What got slower: self time {unit}, {la} -> {lb}{note}",
            ["name", f"self {la}", f"self {lb}", "delta", "ratio", f"calls {la}", f"calls {lb}"],
            rows[:top],
            {
                f"self {la}": fmt_ns,
                f"self {lb}": fmt_ns,
                "delta": lambda v: ("+" if v >= 0 else "-") + fmt_ns(abs(v)),
                "ratio": lambda v: "new" if v == float("inf") else f"{v:.2f}x",
                f"calls {la}": lambda v: f"{v:.4g}",
                f"calls {lb}": lambda v: f"{v:.4g}",
            },
        )

    def slower(self, threshold: float = 1.0) -> list[str]:
        """Names of ops whose self time grew by more than `threshold` x (and that ran in both)."""
        return [r[0] for r in self.rows if r[1] > 0 and r[4] > threshold]

    @property
    def device_note(self) -> str:
        """What the traces say about the device they were measured on (e.g. "emulated Gaudi, CPU activity only")."""
        notes = dict.fromkeys(n for n in (self.a.device_note, self.b.device_note) if n)
        return "; ".join(notes)

    def _header(self) -> str:
        la, lb = self.labels
        note = f" — measured on the {self.device_note}" if self.device_note else ""
        if self.step_a and self.step_b:
            return (
                f"Mean step time: {la} {fmt_ns(self.step_a)}, {lb} {fmt_ns(self.step_b)} "
                f"({self.step_b / self.step_a:.2f}x){note}"
            )
        return f"{la}: {len(self.a):,} events; {lb}: {len(self.b):,} events (no ProfilerStep spans to compare){note}"

    def __repr__(self) -> str:
        return self._header() + "\n" + repr(self.table)

    def _repr_html_(self) -> str:
        return f"<div><p>{html.escape(self._header())}</p>{self.table._repr_html_()}</div>"


def _mean_step(t: Trace) -> float:
    return sum(s.duration_ns for s in t.steps) / len(t.steps) if t.steps else 0.0


def compare(a: Trace | str, b: Trace | str, top: int = 20, labels: tuple[str, str] = ("A", "B")) -> Comparison:
    """Compare two traces (objects or paths): which ops take more self time in `b` than in `a`."""
    ta = a if isinstance(a, Trace) else load(a)
    tb = b if isinstance(b, Trace) else load(b)
    return Comparison(ta, tb, top, labels)

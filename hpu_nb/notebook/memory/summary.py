"""TrainingSummary: the text, HTML and static SVG charts of a monitor's state, what stays in the output without a
front end (a saved notebook, a headless run)."""

from __future__ import annotations

import html
import math
import statistics
from typing import Any, Protocol

from hpu_nb.notebook.memory.history import (
    BATCHES,
    IN_USE,
    LIMIT,
    LOSS,
    MAX_IN_USE,
    NAN,
    SAMPLES,
    SECONDS,
    STAGE,
    ChartHistory,
    as_float,
)
from hpu_nb.notebook.memory.planned import MFU_LABEL, PLANNED_LABEL, PlanReference
from hpu_nb.notebook.memory.svg import SvgPlot, rank_style
from hpu_nb.runtime.env import format_bytes
from hpu_nb.runtime.generations import generation_from_name


class MonitorState(Protocol):
    """What a summary reads of a MemoryMonitor (its state after or during a run)."""

    history: ChartHistory
    current: dict[str, Any]
    device_label: str
    is_emulated: bool
    stage: str
    status: str
    oom: dict[str, Any]
    samples: int
    frontend_error: str | None
    rank_history: dict[str, list[Any]]
    plan_reference: PlanReference | None  # MemoryMonitor(plan=...): the plan's peak and FLOPs


PLANNED_COLOUR = "#8c564b"  # the planned peak's reference line (static/training_chart.js: COLORS.planned)


class TrainingSummary:
    """Text, HTML and static SVG charts of a monitor's state: what stays in the output without a front end."""

    def __init__(self, monitor: MonitorState) -> None:
        self.points = [[as_float(v) for v in p] for p in monitor.history.points]
        self.current = dict(monitor.current)
        self.device_label = monitor.device_label
        self.is_emulated = monitor.is_emulated
        self.stage = monitor.stage
        self.status = monitor.status
        self.oom = dict(monitor.oom)
        self.samples = monitor.samples
        self.error = monitor.frontend_error
        self.ranks = monitor.rank_history
        self.planned = getattr(monitor, "plan_reference", None)

    @property
    def limit(self) -> int | None:
        if self.oom.get("limit"):
            return int(self.oom["limit"])
        return self.current.get("Limit") or (int(self.points[-1][LIMIT]) if self.points else None)

    @property
    def peak(self) -> int:
        return int(max([p[MAX_IN_USE] for p in self.points] + [self.current.get("MaxInUse", 0)]))

    @property
    def rank_count(self) -> int:
        """How many ranks' memory was gathered (0 on one device, or before the first gather)."""
        rows = self.ranks.get("in_use") or []
        return len(rows[0]) if self.ranks.get("x") and rows else 0

    def rank_series(self, rank: int) -> tuple[list[float], list[float]]:
        """Rank `rank`'s InUse at the gathered batches: (batches, bytes)."""
        return list(self.ranks["x"]), [float(row[rank]) for row in self.ranks["in_use"]]

    def training(self) -> dict[str, float] | None:
        """Loss and throughput of the training batches: first / last loss, median step time, samples/s, steps/s."""
        train = [p for p in self.points if p[STAGE] == 0]
        losses = [p[LOSS] for p in train if not math.isnan(p[LOSS])]
        timed = [p for p in train if p[BATCHES] > 0 and p[SECONDS] > 0]
        if not (losses or timed):
            return None
        out: dict[str, float] = {}
        if losses:
            out.update(first_loss=losses[0], last_loss=losses[-1])
        if timed:
            # per step (what the chart's throughput panel plots): each sample's own samples / seconds, the median;
            # wall clock: all samples over all the time between training batch ends (slow steps weigh in)
            out["step_time"] = statistics.median(p[SECONDS] / p[BATCHES] for p in timed)
            out["step_samples_per_s"] = statistics.median(p[SAMPLES] / p[SECONDS] for p in timed)
            total_s = sum(p[SECONDS] for p in timed)
            out["wall_seconds"] = total_s
            out["samples_per_s"] = sum(p[SAMPLES] for p in timed) / total_s
            out["steps_per_s"] = sum(p[BATCHES] for p in timed) / total_s
        return out

    def mfu(self) -> tuple[float, float] | None:
        """(MFU, the median measured step time it divides by), from the plan's FLOPs; None without a plan, a timed
        training step or a known peak."""
        training = self.training()
        if self.planned is None or not training or "step_time" not in training:
            return None
        mfu = self.planned.mfu(training["step_time"])
        return None if mfu is None else (mfu, training["step_time"])

    def planned_lines(self, measured: str) -> list[str]:
        """The plan's peak beside the measured MaxInUse, and the MFU (text of the summary)."""
        if self.planned is None:
            return []
        planned = self.planned
        ratio = f"; measured MaxInUse / planned = {self.peak / planned.peak_bytes:.3f}" if planned.peak_bytes else ""
        lines = [f"Planned peak {format_bytes(planned.peak_bytes)} per card (hpu_nb.plan, an estimate: "
                 f"{planned.description}){ratio}"]
        mfu = self.mfu()
        if mfu is not None:
            value, step = mfu
            lines.append(f"{MFU_LABEL}: {100 * value:.3g}% = {planned.flops_per_step:.4g} FLOPs per step / "
                         f"{step * 1e3:.4g} ms median measured step time / {planned.peak_flops:.4g} FLOP/s peak "
                         f"({planned.generation}, {planned.precision}){measured}")
        running = _generation_of(self.device_label)
        if running is not None and running != planned.generation:
            lines.append(f"(the plan is for {planned.generation}, the run is on {running}: the planned peak and the "
                         f"MFU's peak FLOP/s are {planned.generation}'s; plan with generation= for this card)")
        return lines

    def lines(self) -> list[str]:
        measured = " (emulated: CPU time and host memory)" if self.is_emulated else ""
        head = f"MemoryMonitor — {self.device_label}"
        if self.status == "idle" and not self.points:
            return [head, "No samples yet: pass it to a Trainer as a callback (callbacks=[monitor]) and fit."]
        status = "stopped by you" if self.status == "stopped" else self.status
        lines = [f"{head} — {self.stage or 'run'}: {self.samples} batches sampled ({status})"]
        if "InUse" not in self.current:
            lines.append(f"This accelerator reports no HPU memory counters: {sorted(self.current)}")
            return lines
        limit, peak = self.limit or 0, self.peak
        if self.oom:
            needed = self.oom["in_use"] + (self.oom.get("requested") or 0)
            lines.append(
                f"Peak (MaxInUse) {format_bytes(peak)} of Limit {format_bytes(limit)}{measured}: no headroom — the run "
                f"needed at least {format_bytes(needed)}, {format_bytes(max(needed - limit, 0))} more than the Limit"
            )
        else:
            pct = 100.0 * (limit - peak) / limit if limit else 0.0
            lines.append(f"Peak (MaxInUse) {format_bytes(peak)} of Limit {format_bytes(limit)}{measured}: "
                         f"headroom {format_bytes(limit - peak)} ({pct:.1f}% free)")
        lines += self.planned_lines(measured)
        shown = {k: v for k, v in self.current.items() if k not in ("Limit", "MaxInUse")}
        if self.oom:
            shown.pop("InUse", None)  # after an OOM the figure that counts is the one at the failure, below
        lines.append("Now: " + ", ".join(
            f"{k} {format_bytes(v) if k in ('InUse', 'MaxAllocSize') else v}" for k, v in shown.items()))
        training = self.training()
        if training:
            parts = []
            if "last_loss" in training:
                parts.append(f"loss {training['first_loss']:.4g} -> {training['last_loss']:.4g}")
            if "step_time" in training:
                parts.append(f"per step (median, as the chart): {training['step_time'] * 1e3:.1f} ms, "
                             f"{training['step_samples_per_s']:,.0f} samples/s; wall clock over "
                             f"{training['wall_seconds']:.1f} s of training batches: {training['steps_per_s']:.1f} "
                             f"steps/s, {training['samples_per_s']:,.0f} samples/s")
            lines.append("Training: " + "; ".join(parts) + measured)
        if self.ranks.get("x"):
            last = self.ranks["in_use"][-1]
            lines.append("Per rank InUse (last gathered): " + ", ".join(
                f"rank {r} {format_bytes(v)}" for r, v in enumerate(last)))
        if self.oom:
            requested = self.oom.get("requested")
            ask = f": tried to allocate {format_bytes(requested)}" if requested else ""
            lines.append(
                f"OUT OF MEMORY at batch {self.oom['x']} ({self.oom.get('stage', '?')}): the Limit "
                f"{format_bytes(limit)} was hit with {format_bytes(self.oom['in_use'])} in use{ask}."
            )
        if self.error:
            lines.append(f"(live chart disabled after a widget error: {self.error}; training was not affected)")
        return lines

    def text(self) -> str:
        return "\n".join(self.lines())

    def memory_svg(self, width: int = 640, height: int = 170) -> str:
        """InUse / MaxInUse (and Limit when in scale) vs batch, epoch marks, the OOM marker."""
        if not self.points:
            return ""
        limit, peak = self.limit or 1, self.peak
        ranks = [self.rank_series(r) for r in range(self.rank_count)]
        planned = self.planned.peak_bytes if self.planned is not None else 0
        top = max([peak, planned, self.oom.get("in_use", 0) + (self.oom.get("requested") or 0)]
                  + [max(values) for _, values in ranks])
        show_limit = bool(self.oom) or top >= 0.05 * limit
        ymax = max(limit if show_limit else top, top, 1) * 1.08
        plot = SvgPlot(self.points, width, height, ymax, self.oom.get("x", 0))
        parts = plot.frame([(0, format_bytes(0)), (ymax / 1.08 / 2, format_bytes(ymax / 1.08 / 2)),
                            (ymax / 1.08, format_bytes(ymax / 1.08))], label="device memory")
        if show_limit:
            parts.append(plot.line(LIMIT, "#d62728", 'stroke-dasharray="5,3"'))
        else:
            parts.append(f'<text x="{plot.left + plot.w}" y="{plot.top - 6}" text-anchor="end" fill="#d62728">Limit '
                         f"{format_bytes(limit)} (off scale)</text>")
        # InUse / MaxInUse are rank 0's (sampled every batch); the other ranks' gathered InUse as dashed lines over
        # them (svg.RANK_STYLES): one line per rank and series
        parts += [plot.line(MAX_IN_USE, "#ff7f0e"), plot.line(IN_USE, "#1f77b4")]
        if self.planned is not None:  # the plan's peak: a horizontal reference beside the measured MaxInUse
            y = plot.sy(planned)
            parts.append(f'<line data-series="planned" x1="{plot.left}" x2="{plot.left + plot.w}" y1="{y:.1f}" '
                         f'y2="{y:.1f}" stroke="{PLANNED_COLOUR}" stroke-width="1.4" stroke-dasharray="8,4"/>')
            parts.append(f'<text x="{plot.left + 4}" y="{y - 4:.1f}" fill="{PLANNED_COLOUR}">planned peak '
                         f"{format_bytes(planned)} (estimate)</text>")
        parts += [plot.rank_line(r, *series) for r, series in enumerate(ranks) if r]
        if self.oom:
            x, y0 = plot.sx(self.oom["x"]), plot.sy(self.oom["in_use"])
            y1 = max(plot.sy(self.oom["in_use"] + (self.oom.get("requested") or 0)), plot.top)
            parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y0:.1f}" y2="{y1:.1f}" stroke="#d62728" '
                         'stroke-width="4"/>')
            parts.append(f'<text x="{x - 4:.1f}" y="{plot.top + 12}" text-anchor="end" fill="#d62728" '
                         'font-weight="bold">OOM</text>')
        return "".join(parts) + "</svg>"

    def loss_svg(self, width: int = 640, height: int = 120) -> str:
        """The training loss vs batch (epoch marks), when the steps returned one."""
        losses = [p[LOSS] for p in self.points if math.isfinite(p[LOSS])]  # an inf / nan loss is not drawn
        if not losses:
            return ""
        low, high = min(losses), max(losses)
        pad = (high - low) * 0.08 or abs(high) * 0.1 or 1.0
        plot = SvgPlot(self.points, width, height, high + pad, 0, ymin=low - pad)
        parts = plot.frame([(low, f"{low:.3g}"), (high, f"{high:.3g}")], label="loss")
        return "".join(parts) + plot.line(LOSS, "#2ca02c") + "</svg>"

    def rate_svg(self, width: int = 640, height: int = 100) -> str:
        """Throughput per step (each timed training sample's samples / seconds), as the live chart's third panel."""
        rated = [p[:SECONDS] + [p[SAMPLES] / p[SECONDS]] + p[SECONDS + 1:] if p[STAGE] == 0 and p[BATCHES] > 0
                 and p[SECONDS] > 0 else p[:SECONDS] + [NAN] + p[SECONDS + 1:] for p in self.points]
        rates = [p[SECONDS] for p in rated if math.isfinite(p[SECONDS])]
        if not rates:
            return ""
        low, high = min(rates), max(rates)
        # the axis ignores spikes, as the live chart's (TensorBoard's "ignore outliers"): one fast step no longer
        # flattens the others to the floor; faster steps are drawn at the top edge and counted
        top = robust_top(sorted(rates))
        spikes = sum(rate > top for rate in rates)
        clipped = [p[:SECONDS] + [min(p[SECONDS], top)] + p[SECONDS + 1:] for p in rated]
        pad = (top - low) * 0.08 or abs(top) * 0.1 or 1.0
        median = _quantile(sorted(rates), 0.5)
        # from 0, as the live chart: a step at half the speed reads as half the height
        plot = SvgPlot(clipped, width, height, top + pad, 0, ymin=0.0)
        parts = plot.frame([(0.0, "0"), (median, f"{median:,.0f}"), (top, f"{top:,.0f}")],
                           label="throughput per step (samples/s)")
        if spikes:
            parts.append(f'<text x="{plot.left + plot.w}" y="{plot.top - 6}" text-anchor="end" fill="#9467bd">'
                         f"{spikes} step{'' if spikes == 1 else 's'} off scale (fastest {high:,.0f})</text>")
        return "".join(parts) + plot.line(SECONDS, "#9467bd") + "</svg>"

    def training_svg(self, width: int = 640) -> str:
        """Loss and throughput per step as one picture of two stacked panels (as in the live chart)."""
        loss, rate = self.loss_svg(width), self.rate_svg(width)
        if not (loss and rate):
            return loss or rate
        inner = [svg[svg.index(">") + 1: -len("</svg>")] for svg in (loss, rate)]  # each without its <svg> tag
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="220" font-family="sans-serif" '
                f'font-size="10">{inner[0]}<g transform="translate(0,120)">{inner[1]}</g></svg>')

    def legend_html(self) -> str:
        """The charts' legend: one entry per line drawn, each rank's with a swatch of its own line style."""
        rank0 = "rank 0 " if self.rank_count else ""
        entries = [f'<span style="color:#1f77b4">━ {rank0}InUse</span>',
                   f'<span style="color:#ff7f0e">━ {rank0}MaxInUse</span>',
                   '<span style="color:#d62728">┅ Limit</span>']
        if self.planned is not None:
            entries.append(f'<span data-series="planned" style="color:{PLANNED_COLOUR}">╌ {PLANNED_LABEL}</span>')
        for rank in range(1, self.rank_count):
            colour, width, dash, opacity = rank_style(rank)
            dashed = f' stroke-dasharray="{dash}"' if dash else ""
            swatch = (f'<svg width="20" height="8" style="vertical-align:middle"><line x1="0" y1="4" x2="20" '
                      f'y2="4" stroke="{colour}" stroke-width="{width:g}" stroke-opacity="{opacity:g}"{dashed}/></svg>')
            entries.append(f'<span data-series="rank{rank}" style="color:{colour}">{swatch} rank {rank} InUse</span>')
        entries += ['<span style="color:#2ca02c">━ training loss</span>',
                    '<span style="color:#9467bd">━ samples/s per step</span>',
                    '<span style="color:#999">┆ epoch</span>']
        return f'<div style="font-size:11px">{" ".join(entries)}</div>'

    def html(self) -> str:
        lines = self.lines()
        legend = self.legend_html()
        body = "<br>".join(html.escape(line) for line in lines[1:])
        training = self.training_svg()
        charts = self.memory_svg() + ("<br>" + training if training else "")
        return (f'<div class="hpu-memory-summary" style="font-family:sans-serif;font-size:12px">'
                f"<b>{html.escape(lines[0])}</b><br>{body}<br>{charts}{legend if self.points else ''}</div>")


def _generation_of(device_label: str) -> str | None:
    """The generation label ("Gaudi2") of a monitor's device label ("GAUDI2 (emulated)"), None if it names none."""
    try:
        return generation_from_name(device_label.split()[0]).label if device_label.strip() else None
    except ValueError:
        return None


RATE_TOP_MAX = 2.5  # the throughput axis's top at most this x the median step rate (training_chart.js: RATE_TOP_MAX)


def robust_top(ordered: list[float]) -> float:
    """The top of the throughput axis for sorted values (static/training_chart.js's robustTop is the same rule): with
    5 or more, Tukey's far-out fence (Q3 + 3 IQR) kept between 1.2 x and RATE_TOP_MAX x the median, never above the
    maximum; a handful of fast steps (a percentile would follow them) then sit above it. The cap: on a loaded machine
    step times spread, the IQR widens and the fence alone reached ~7.5 x the median (the typical step at 12% of the
    panel); capped, the median step sits above a third of it."""
    high = ordered[-1]
    if len(ordered) < 5:
        return high
    q1, median, q3 = (_quantile(ordered, q) for q in (0.25, 0.5, 0.75))
    return min(high, max(min(q3 + 3 * (q3 - q1), RATE_TOP_MAX * median), 1.2 * median))


def _quantile(ordered: list[float], q: float) -> float:
    """The q-quantile of sorted values, linearly interpolated (as the live chart's)."""
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)

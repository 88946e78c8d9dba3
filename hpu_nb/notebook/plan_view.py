"""The notebook's view of an hpu_nb.plan: a stacked bar of what each card holds against the HBM of Gaudi 1 / 2 / 3,
the batch-size sweep with the largest batch that fits, and the figures; `%hpu_plan` makes one from a cell.

Static SVG + HTML, as the memory monitor's summaries are (hpu_nb.notebook.memory.summary): the view needs no
JavaScript, so it reads the same live, headless (nbmake), in a saved notebook and on GitHub; its text form is the
plan's own (Plan.to_text()). Every figure is labelled an estimate.
"""

from __future__ import annotations

import argparse
import html
import shlex
from collections.abc import Sequence
from typing import Any

from hpu_nb.plan import Plan, plan, plan_batch_sizes
from hpu_nb.plan.planner import DEFAULT_MARGIN, generations
from hpu_nb.runtime.env import format_bytes

__all__ = ["PlanView", "hpu_plan_magic", "plan_html"]

# One colour per breakdown category (the order of Plan.breakdown)
COLOURS = {
    "parameters": "#1f77b4", "gradients": "#ff7f0e", "optimizer_state": "#2ca02c", "activations": "#d62728",
    "temporaries": "#9467bd", "batch": "#8c564b", "communication": "#17becf",
}
_HBM_DASH = {"gaudi": "2,2", "gaudi2": "6,3", "gaudi3": ""}


def _bar_svg(plan: Plan, width: int = 640) -> str:
    """One horizontal stacked bar (each card holds the same: the cards run the same step on their own batch) with a
    vertical HBM line per generation."""
    left, right, bar_y, bar_h = 10, 10, 34, 28
    gens = generations()
    top = max([plan.peak_bytes, *(gen.hbm_bytes for gen in gens.values())]) * 1.05
    scale = (width - left - right) / top
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="118" font-family="sans-serif" '
             'font-size="10" data-plan="bar">',
             f'<text x="{left}" y="12">each of {plan.world_size} card(s): planned peak '
             f'{html.escape(format_bytes(plan.peak_bytes))} (estimate)</text>']
    x = float(left)
    for key, value in plan.breakdown.items():
        if value <= 0:
            continue
        w = value * scale
        parts.append(f'<rect data-category="{key}" x="{x:.2f}" y="{bar_y}" width="{max(w, 0.5):.2f}" '
                     f'height="{bar_h}" fill="{COLOURS.get(key, "#999")}"><title>{key.replace("_", " ")}: '
                     f'{html.escape(format_bytes(value))}</title></rect>')
        x += w
    for key, gen in gens.items():
        gx = left + gen.hbm_bytes * scale
        chosen = key == plan.generation.key
        parts.append(f'<line data-hbm="{key}" x1="{gx:.1f}" x2="{gx:.1f}" y1="{bar_y - 8}" y2="{bar_y + bar_h + 8}" '
                     f'stroke="{"#000" if chosen else "#888"}" stroke-width="{1.6 if chosen else 1}" '
                     f'stroke-dasharray="{_HBM_DASH.get(key, "")}"/>')
        parts.append(f'<text x="{gx:.1f}" y="{bar_y + bar_h + 19}" text-anchor="middle" '
                     f'fill="{"#000" if chosen else "#666"}">{gen.label} {gen.hbm_bytes >> 30} GiB</text>')
    lx = left
    for key, colour in COLOURS.items():
        parts.append(f'<rect x="{lx}" y="98" width="9" height="9" fill="{colour}"/>'
                     f'<text x="{lx + 12}" y="106">{key.replace("_", " ")}</text>')
        lx += 12 + 6 * len(key) + 14
    parts.append("</svg>")
    return "".join(parts)


def _sweep_svg(sweep: Sequence[Plan], largest: int | None, margin: float, width: int = 640, height: int = 200) -> str:
    """Planned peak per card against the per-card batch size, with the card's HBM and the margin's line."""
    left, right, top, bottom = 70, 12, 12, 30
    gen = sweep[0].generation
    xs = [p.batch_size for p in sweep]
    ymax = max([p.peak_bytes for p in sweep] + [gen.hbm_bytes]) * 1.08
    x0, x1 = min(xs), max(xs + [largest or 0])
    x1 = max(x1, x0 + 1)

    def sx(x: float) -> float:
        return left + (width - left - right) * (x - x0) / (x1 - x0)

    def sy(y: float) -> float:
        return top + (height - top - bottom) * (1 - y / ymax)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             'font-size="10" data-plan="sweep">',
             f'<rect x="{left}" y="{top}" width="{width - left - right}" height="{height - top - bottom}" '
             'fill="#fafafa" stroke="#ddd"/>']
    for y, label, dash in ((gen.hbm_bytes, f"{gen.label} HBM", ""),
                           (gen.hbm_bytes * (1 - margin), f"{margin:.0%} margin", "4,3")):
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" stroke="#000" '
                     f'stroke-dasharray="{dash}"/><text x="{left + 4}" y="{sy(y) - 3:.1f}">{label}</text>')
    for y in (0, ymax / 2, ymax / 1.08):
        parts.append(f'<text x="{left - 4}" y="{sy(y) + 3:.1f}" text-anchor="end">'
                     f'{html.escape(format_bytes(int(y)))}</text>')
    points = " ".join(f"{sx(p.batch_size):.1f},{sy(p.peak_bytes):.1f}" for p in sweep)
    parts.append(f'<polyline fill="none" stroke="#d62728" stroke-width="1.8" points="{points}"/>')
    for p in sweep:
        parts.append(f'<circle cx="{sx(p.batch_size):.1f}" cy="{sy(p.peak_bytes):.1f}" r="3" '
                     f'fill="{"#2ca02c" if p.fits else "#d62728"}"><title>batch {p.batch_size}: '
                     f'{html.escape(format_bytes(p.peak_bytes))}</title></circle>')
    if largest:
        parts.append(f'<line data-largest="{largest}" x1="{sx(largest):.1f}" x2="{sx(largest):.1f}" y1="{top}" '
                     f'y2="{height - bottom}" stroke="#2ca02c" stroke-dasharray="3,2"/>'
                     f'<text x="{sx(largest) - 3:.1f}" y="{top + 10}" text-anchor="end" fill="#2ca02c">largest batch '
                     f"that fits: {largest}</text>")
    parts.append(f'<text x="{left}" y="{height - 8}">batch per card {x0}</text><text x="{width - right}" '
                 f'y="{height - 8}" text-anchor="end">{x1}</text></svg>')
    return "".join(parts)


def plan_html(plan: Plan, sweep: Sequence[Plan] = (), largest: int | None = None,
              margin: float = DEFAULT_MARGIN) -> str:
    """The plan as HTML: verdict, stacked bar, sweep chart (when given), the figures and the notes."""
    others = ", ".join(f"{gen.label}: {'yes' if plan.fits_on(gen) else 'no'}" for gen in generations().values())
    verdict = (f"{'fits' if plan.fits else 'does not fit'} on {plan.world_size} × {plan.generation.label}"
               f" (per card on {others})")
    colour = "#d8f0dc" if plan.fits else "#f8d7da"
    rows = "".join(f"<tr><td style='padding:0 8px'>{html.escape(label)}</td><td>{html.escape(value)}</td></tr>"
                   for label, value in plan.summary_rows())
    notes = "".join(f"<li>{html.escape(note)}</li>" for note in plan.notes)
    sweep_part = _sweep_svg(sweep, largest, margin) if len(sweep) >= 2 else ""
    return (f'<div data-hpu-plan="1"><div style="background:{colour};padding:3px 8px;border-radius:4px;'
            f'display:inline-block">hpu_nb.plan (estimate): {html.escape(verdict)}</div>'
            f"<div>{_bar_svg(plan)}</div><div>{sweep_part}</div>"
            f"<table style='font-size:12px'>{rows}</table><ul style='font-size:11px;color:#555'>{notes}</ul></div>")


class PlanView:
    """A plan (and optionally its batch-size sweep) for the notebook: HTML with static SVG, and plain text."""

    def __init__(self, plan: Plan, sweep: Sequence[Plan] = (), largest: int | None = None,
                 margin: float = DEFAULT_MARGIN) -> None:
        self.plan, self.sweep, self.largest, self.margin = plan, list(sweep), largest, margin

    def _repr_html_(self) -> str:
        return plan_html(self.plan, self.sweep, self.largest, self.margin)

    def __repr__(self) -> str:
        text = self.plan.to_text()
        if self.sweep:
            text += "\nbatch sweep (per card): " + ", ".join(
                f"{p.batch_size}: {format_bytes(p.peak_bytes)}{'' if p.fits else ' (does not fit)'}"
                for p in self.sweep)
        if self.largest is not None:
            text += f"\nlargest batch that fits with a {self.margin:.0%} margin: {self.largest}"
        return text


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="%hpu_plan", add_help=False)
    parser.add_argument("model")
    parser.add_argument("batch")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--generation", default="gaudi2")
    parser.add_argument("--sweep", default="", help="comma-separated per-card batch sizes")
    parser.add_argument("--largest", action="store_true", help="find the largest batch that fits")
    parser.add_argument("--margin", type=float, default=DEFAULT_MARGIN)
    return parser


def hpu_plan_magic(line: str = "", namespace: dict[str, Any] | None = None) -> PlanView | None:
    """%hpu_plan MODEL BATCH [--devices N] [--num-nodes N] [--strategy S] [--precision P] [--generation G]
    [--sweep 1,2,4,8] [--largest] [--margin 0.1]: plan the notebook's MODEL on BATCH (names in the notebook)."""
    try:
        args = _parser().parse_args(shlex.split(line))
    except SystemExit:
        print(hpu_plan_magic.__doc__)
        return None
    if namespace is None:
        from IPython import get_ipython  # noqa: PLC0415 -- lazy: the notebook layer's only IPython import here

        shell = get_ipython()
        namespace = shell.user_ns if shell is not None else {}
    missing = [name for name in (args.model, args.batch) if name not in namespace]
    if missing:
        print(f"%hpu_plan: {', '.join(missing)} not defined in the notebook (give a LightningModule and one batch, a "
              "DataLoader or a LightningDataModule by name).")
        return None
    sizes = [int(size) for size in args.sweep.split(",") if size.strip()]
    kwargs = {"devices": args.devices, "num_nodes": args.num_nodes, "strategy": args.strategy,
              "precision": args.precision, "generation": args.generation}
    progress = _Progress()
    progress.say(f"tracing {args.model}'s training step on fake hpu tensors…")
    if sizes:
        sweep = plan_batch_sizes(namespace[args.model], namespace[args.batch], sizes, **kwargs)
        result = sweep[0]
    else:
        result, sweep = plan(namespace[args.model], namespace[args.batch], **kwargs), []
    largest = None
    if args.largest:
        progress.say("finding the largest batch that fits (a few more traces)…")
        largest = result.largest_batch(args.margin)
    progress.done()
    return PlanView(result, sweep, largest, args.margin)


class _Progress:
    """A one-line status while tracing (a display that is updated, then cleared): tracing a big model takes seconds."""

    def __init__(self) -> None:
        self.handle: Any = None

    def say(self, text: str) -> None:
        try:
            from IPython.display import display  # noqa: PLC0415

            if self.handle is None:
                self.handle = display({"text/plain": text}, raw=True, display_id=True)
            else:
                self.handle.update({"text/plain": text}, raw=True)
        except Exception:
            self.handle = None

    def done(self) -> None:
        if self.handle is not None:
            self.handle.update({"text/plain": ""}, raw=True)

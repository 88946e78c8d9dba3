"""%hpu_info: what is here — backend, devices, memory, versions, flags — as rich HTML with a plain-text twin."""

from __future__ import annotations

import html
import shlex
from typing import Any

from hpu_nb.runtime.env import format_bytes
from hpu_nb.runtime.info import HPUInfo, collect_info

USAGE = "Usage: %hpu_info [--text] [--timeout SECONDS]"
MAX_DEVICE_ROWS = 16  # rows of the devices table; identical neighbouring cards share one row


def _bytes(n: int | None) -> str:
    return "—" if n is None else format_bytes(n)


def _num(x: float | None, unit: str) -> str:
    return "—" if x is None else f"{x:g} {unit}"


def _headline(info: HPUInfo) -> str:
    """The backend's own description (DeviceBackend.describe), as a sentence; the emulated one says what it is not."""
    headline = info.description[:1].upper() + info.description[1:]
    if info.is_emulated:
        return (f"{headline} (emulated) — not a real Gaudi; memory figures are measured tensor memory of this process"
                " on the CPU.")
    return headline


def _version_rows(info: HPUInfo) -> list[tuple[str, str]]:
    v = info.versions
    na = "n/a (emulated)" if info.is_emulated else "unknown"
    rows = [
        ("SynapseAI", v.synapseai or na),
        ("firmware", v.firmware or na),
        ("driver", v.driver or na),
        ("habana_frameworks", v.habana_frameworks or ("not installed" if info.is_emulated else "unknown")),
        ("torch", v.torch or "not installed"),
        ("lightning", v.lightning or "not installed"),
    ]
    rows += sorted(v.extra.items())
    return rows


def _execution_mode(info: HPUInfo) -> str:
    if not info.lazy_mode:
        return "eager (PT_HPU_LAZY_MODE=0)"
    if info.is_emulated:  # the emulation computes eagerly; it only places (and counts) the mark_step calls
        return "lazy (PT_HPU_LAZY_MODE=1: mark_step placed as on a Gaudi; the emulation computes eagerly)"
    return "lazy (graph mode, mark_step runs the graph)"


def _summary_rows(info: HPUInfo) -> list[tuple[str, str]]:
    fp16, fp16_why = info.fp16
    fp8, fp8_why = info.fp8
    return [
        ("backend", f"{info.backend} ({'emulated Gaudi' if info.is_emulated else 'real Gaudi'})"),
        ("generation", f"{info.generation} ({info.device_name}, {format_bytes(info.hbm_bytes)} HBM)"),
        ("devices", str(info.device_count)),
        ("execution mode", _execution_mode(info)),
        ("fp16", "available" if fp16 else f"no — {fp16_why}"),
        ("fp8", "available" if fp8 else f"no — {fp8_why}"),
        ("autocast device_type", info.autocast_device_type),
        ("distributed backend", info.dist_backend),
        ("dynamic shapes", {True: "on", False: "off", None: "unknown"}[info.dynamic_shapes]),
    ]


def metric_rows(info: HPUInfo) -> list[tuple[str, str]]:
    """Habana's global metrics, one row per metric ("graph_compilation": "TotalNumber 3, TotalTime 1.2 ms, ..."),
    per-recipe tables shown by their size."""
    rows = []
    for name, tags in sorted(info.metrics.items()):
        shown = [f"{tag} {len(value)} entries" if isinstance(value, dict) else f"{tag} {format_metric(tag, value)}"
                 for tag, value in tags.items()]
        rows.append((name, ", ".join(shown) or "none"))
    return rows


def format_metric(tag: str, value: Any) -> str:
    """A metric's value with its unit: Habana reports the *Time tags (TotalTime, AvgTime) in microseconds."""
    if tag.endswith("Time") and isinstance(value, (int, float)) and not isinstance(value, bool):
        us = float(value)
        if us >= 1e6:
            return f"{us / 1e6:.2f} s"
        if us >= 1e3:
            return f"{us / 1e3:.1f} ms"
        return f"{us:.0f} us"
    return str(value)


def device_rows(info: HPUInfo) -> tuple[list[tuple[str, Any]], int]:
    """([(index label, facts)], cards not shown): runs of cards with the same facts share a row ("[0-7]"),
    at most MAX_DEVICE_ROWS rows, so the report stays small whatever the card count."""
    rows: list[tuple[str, Any]] = []
    shown = 0
    start = 0
    devices = info.devices
    for k in range(1, len(devices) + 1):
        if k < len(devices) and _same_card(devices[k], devices[start]):
            continue
        if len(rows) == MAX_DEVICE_ROWS:
            break
        first, last = devices[start].index, devices[k - 1].index
        rows.append((f"{first}" if first == last else f"{first}-{last}", devices[start]))
        shown += k - start
        start = k
    return rows, info.device_count - shown


def _same_card(a: Any, b: Any) -> bool:
    return (a.name, a.memory_total, a.memory_used, a.memory_peak, a.utilization, a.temperature, a.power,
            a.source) == (b.name, b.memory_total, b.memory_used, b.memory_peak, b.utilization, b.temperature,
                          b.power, b.source)


def _not_shown(count: int) -> str:
    return f"... {count:,} more card{'s' if count != 1 else ''} not listed"


def render_text(info: HPUInfo) -> str:
    """Readable plain text (terminals, plain IPython, `%hpu_info --text`)."""
    lines = [_headline(info), ""]
    width = max(len(k) for k, _ in _summary_rows(info) + _version_rows(info))
    lines += [f"  {k:<{width}}  {v}" for k, v in _summary_rows(info)]
    lines += ["", "Devices:"]
    rows, hidden = device_rows(info)
    for label, d in rows:
        peak = f", peak {_bytes(d.memory_peak)}" if d.memory_peak is not None else ""
        extra = ""
        if d.utilization is not None or d.temperature is not None or d.power is not None:
            extra = f", util {_num(d.utilization, '%')}, {_num(d.temperature, 'C')}, {_num(d.power, 'W')}"
        lines.append(
            f"  [{label}] {d.name}: total {_bytes(d.memory_total)}, in use {_bytes(d.memory_used)}{peak}{extra}"
            f"  ({d.source})"
        )
    if hidden:
        lines.append(f"  {_not_shown(hidden)}")
    if info.metrics:
        lines += ["", "Metrics (Habana's global metrics):"]
        lines += [f"  {k:<{width}}  {v}" for k, v in metric_rows(info)]
    lines += ["", "Versions:"]
    lines += [f"  {k:<{width}}  {v}" for k, v in _version_rows(info)]
    lines += ["", "Environment flags (set):"]
    set_flags = info.flags_set
    if set_flags:
        lines += [f"  {f.name}={f.value}    # {f.meaning}" for f in set_flags]
    else:
        lines.append("  none set (defaults apply)")
    unset = [f.name for f in info.flags if f.value is None]
    if unset:
        lines.append(f"  unset: {', '.join(unset)}")
    if info.problems:
        lines += ["", "Problems (figures above fall back to what the runtime knows):"]
        lines += [f"  - {p}" for p in info.problems]
    lines += ["", f"(collected in {info.seconds * 1000:.0f} ms)"]
    return "\n".join(lines)


_CSS = """
<style>
.hpu-info{font-family:var(--jp-ui-font-family,system-ui,sans-serif);font-size:13px;max-width:960px}
.hpu-info h4{margin:.6em 0 .3em 0;font-size:14px}
.hpu-info table{border-collapse:collapse;margin-bottom:.4em}
.hpu-info table td,.hpu-info table th{padding:2px 10px 2px 0;text-align:left !important;vertical-align:top}
.hpu-info details{margin:.2em 0}
.hpu-info summary{cursor:pointer;color:#555}
.hpu-info th{font-weight:600;border-bottom:1px solid #ccc}
.hpu-info .badge{display:inline-block;padding:4px 10px;border-radius:4px;font-weight:600}
.hpu-info .emulated{background:#fff3cd;color:#6b4e00;border:1px solid #e0c060}
.hpu-info .real{background:#d8f0dc;color:#14532d;border:1px solid #7cbf8a}
.hpu-info .muted{color:#777}
.hpu-info code{font-size:12px}
</style>
"""


def _table(rows: list[tuple[str, str]]) -> str:
    return "<table>" + "".join(
        f"<tr><td><b>{html.escape(k)}</b></td><td>{html.escape(v)}</td></tr>" for k, v in rows
    ) + "</table>"


def render_html(info: HPUInfo) -> str:
    """Rich HTML for notebooks (JupyterLab, Notebook 7, VS Code)."""
    badge = "emulated" if info.is_emulated else "real"
    parts = [_CSS, '<div class="hpu-info">', f'<div class="badge {badge}">{html.escape(_headline(info))}</div>']
    parts += ["<h4>Backend</h4>", _table(_summary_rows(info))]
    parts.append("<h4>Devices</h4><table><tr><th>#</th><th>name</th><th>total</th><th>in use</th><th>peak</th>"
                 "<th>util</th><th>temp</th><th>power</th><th>source</th></tr>")
    rows, hidden = device_rows(info)
    for label, d in rows:
        cells = [label, d.name, _bytes(d.memory_total), _bytes(d.memory_used), _bytes(d.memory_peak),
                 _num(d.utilization, "%"), _num(d.temperature, "C"), _num(d.power, "W"), d.source]
        parts.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    if hidden:
        parts.append(f'<tr><td colspan="9" class="muted">{html.escape(_not_shown(hidden))}</td></tr>')
    parts.append("</table>")
    if info.metrics:
        parts += ["<h4>Metrics</h4>", _table(metric_rows(info))]
    parts += ["<h4>Versions</h4>", _table(_version_rows(info))]
    header = "<tr><th>flag</th><th>value</th><th>what it does</th></tr>"

    def flag_rows(flags: list) -> str:
        rows = []
        for f in flags:
            unset = '<span class="muted">unset</span>'
            value = f"<code>{html.escape(f.value)}</code>" if f.value is not None else unset
            rows.append(f"<tr><td><code>{html.escape(f.name)}</code></td><td>{value}</td>"
                        f"<td>{html.escape(f.meaning)}</td></tr>")
        return "".join(rows)

    set_flags, unset = info.flags_set, [f for f in info.flags if f.value is None]
    parts.append("<h4>Environment flags</h4>")
    if set_flags:
        parts.append(f"<table>{header}{flag_rows(set_flags)}</table>")
    else:
        parts.append('<div class="muted">none set: defaults apply</div>')
    if unset:
        parts.append(f"<details><summary>{len(unset)} more flags, unset (what each does)</summary>"
                     f"<table>{header}{flag_rows(unset)}</table></details>")
    if info.problems:
        parts.append("<h4>Problems</h4><ul>" + "".join(f"<li>{html.escape(p)}</li>" for p in info.problems) + "</ul>")
    parts.append(f'<div class="muted">collected in {info.seconds * 1000:.0f} ms</div></div>')
    return "".join(parts)


class HPUInfoReport:
    """The result of %hpu_info: shows as HTML in notebooks and as text everywhere else."""

    def __init__(self, info: HPUInfo) -> None:
        self.info = info

    def _repr_html_(self) -> str:
        return render_html(self.info)

    def __repr__(self) -> str:
        return render_text(self.info)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(render_text(self.info))


class _TextOnly:
    """Forces plain text even in a notebook (`%hpu_info --text`)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.text)


def parse_args(line: str) -> tuple[bool, float]:
    """(text_only, timeout) from the magic's line; ValueError with the usage for anything else."""
    text_only, timeout = False, 2.0
    words = shlex.split(line or "")
    i = 0
    while i < len(words):
        word = words[i]
        if word in ("--text", "-t"):
            text_only = True
        elif word == "--timeout" or word.startswith("--timeout="):
            if "=" in word:
                value = word.split("=", 1)[1]
            else:
                i += 1
                value = words[i] if i < len(words) else ""
            try:
                timeout = float(value)
            except ValueError:
                raise ValueError(f"--timeout needs a number of seconds, got {value!r}. {USAGE}") from None
            if timeout <= 0:
                raise ValueError(f"--timeout must be positive, got {timeout}. {USAGE}")
        else:
            raise ValueError(f"Unknown argument {word!r}. {USAGE}")
        i += 1
    return text_only, timeout


def hpu_info(line: str = "") -> None:
    """The %hpu_info line magic: display the report (HTML + text, or text only with --text)."""
    from IPython.display import display  # noqa: PLC0415 -- lazy: the report renders without IPython (scripts)

    try:
        text_only, timeout = parse_args(line)
    except ValueError as err:
        print(err)
        return
    try:
        report = HPUInfoReport(collect_info(timeout=timeout))
    except Exception as err:
        print(f"%hpu_info: no device backend could be set up: {type(err).__name__}: {err}")
        return
    display(_TextOnly(render_text(report.info)) if text_only else report)

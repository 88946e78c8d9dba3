"""TraceViewer: an inline timeline of a profiler trace that stays responsive on millions of events.

Python keeps the trace (hpu_nb.traces) and answers each view with only what it can show: the
browser sends the window it looks at and its width in pixels, Python sends back the spans wide
enough to see plus one merged block per pixel column for the rest (hpu_nb.traces.lod), so a
full-view payload is a few hundred KB whatever the trace size. The front end is one small ES
module shipped in the package (static/trace_viewer.js, no CDN); it draws on a canvas and puts
every name in the page with textContent / fillText, never as HTML.

Displayed, the viewer is followed by its static snapshot (hpu_nb.notebook.snapshot: op table + an
SVG picture of the timeline, and a plain-text summary): what a saved notebook shows without a kernel
(nbconvert, GitHub, JupyterLab reopened), hidden by the live viewer's CSS while it is on screen.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import pathlib
import shlex
from typing import Any

import anywidget
import numpy as np
import traitlets

from hpu_nb.notebook.snapshot import SnapshotDisplays, live_bundle, snapshot_bundle
from hpu_nb.traces import Trace, find_trace, load, trace_files
from hpu_nb.traces.lod import MAX_NAME, TimelineIndex, ViewPayload
from hpu_nb.traces.render import timeline_svg
from hpu_nb.traces.tables import Table, fmt_ns, shorten
from hpu_nb.wiring.viewer_slot import register_trace_viewer

STATIC = pathlib.Path(__file__).parent / "static"
MAX_DETAIL_CHARS = 300  # per value in the details pane (the name included): a 10 MB op name is not sent whole


class TraceViewer(anywidget.AnyWidget):
    """Timeline (tracks x time, zoom and pan), op table for the view, step picker, search, details on click."""

    _esm = STATIC / "trace_viewer.js"
    _css = STATIC / "trace_viewer.css"

    # set by Python
    title = traitlets.Unicode("").tag(sync=True)
    note = traitlets.Unicode("").tag(sync=True)
    rows = traitlets.List().tag(sync=True)
    steps = traitlets.List().tag(sync=True)
    duration = traitlets.Float(1.0).tag(sync=True)
    payload = traitlets.Bytes(b"").tag(sync=True)
    payload_meta = traitlets.Dict().tag(sync=True)
    ops = traitlets.List().tag(sync=True)
    matches = traitlets.List().tag(sync=True)
    details = traitlets.Dict().tag(sync=True)
    error = traitlets.Unicode("").tag(sync=True)
    # set by the browser
    view = traitlets.List([0.0, 1.0]).tag(sync=True)
    width = traitlets.Int(900).tag(sync=True)
    query = traitlets.Unicode("").tag(sync=True)
    selected = traitlets.Int(-1).tag(sync=True)

    def __init__(self, trace: Trace | str | os.PathLike, top: int = 25, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.trace = trace if isinstance(trace, Trace) else load(trace)
        self.top = top
        self.index = TimelineIndex(self.trace)
        self.last_payload: ViewPayload | None = None
        t = self.trace
        self.title = os.path.basename(t.path) if t.path else "trace"
        self.note = t.device_note
        self.rows = self.index.row_meta()
        self.steps = [[s.number, s.start_ns, s.end_ns] for s in t.steps]
        self.duration = float(max(t.duration_ns, 1))
        with self.hold_sync():
            self.view = [0.0, self.duration]
            self._refresh()

    # -- answering the browser -----------------------------------------------------------------
    @traitlets.observe("view", "width", "query")
    def _on_view(self, change: dict[str, Any]) -> None:
        if change["name"] == "query":
            self._search()
        self._refresh()

    @traitlets.observe("selected")
    def _on_selected(self, change: dict[str, Any]) -> None:
        try:
            i = int(change["new"])
            self.details = details_rows(self.trace.event(i)) if i >= 0 else {}
        except Exception as err:
            self.error = f"details: {type(err).__name__}: {err}"

    def _window(self) -> tuple[float, float]:
        try:
            t0, t1 = (float(v) for v in self.view)
        except (TypeError, ValueError):
            t0, t1 = 0.0, self.duration
        t0 = max(0.0, min(t0, self.duration))
        t1 = min(self.duration, max(t1, t0 + 1000.0))
        if t1 <= t0:
            t0 = max(0.0, t1 - 1000.0)
        return t0, t1

    def _match_ids(self) -> np.ndarray | None:
        q = self.query.strip()
        return self.trace.name_ids_matching(q) if q else None

    def _refresh(self) -> None:
        try:
            t0, t1 = self._window()
            payload = self.index.view(t0, t1, self.width, match_ids=self._match_ids())
            self.last_payload = payload
            with self.hold_sync():
                self.payload = payload.data
                self.payload_meta = dict(payload.meta, bytes=payload.nbytes)
                self.ops = self._ops_in_window(t0, t1)
                self.error = ""
        except Exception as err:
            self.error = f"{type(err).__name__}: {err}"

    def _ops_in_window(self, t0: float, t1: float) -> list[list[Any]]:
        """Top ops by self time among the spans in the window, as the timeline draws them: every span that overlaps
        it, also those that started before it (zoomed inside a long span, that span is what is in view)."""
        t = self.trace
        mask = (t.ts < t1) & (t.end > t0) & t.op_mask  # ts is sorted per track only: a mask, not a search
        if not mask.any():
            return []
        calls, total, self_t = t._aggregate(mask)
        nz = np.flatnonzero(calls)
        pick = nz[np.argsort(-self_t[nz], kind="stable")][: self.top]
        return [[shorten(t.names[k], MAX_NAME), int(calls[k]), float(total[k]), float(self_t[k])] for k in pick]

    def _search(self) -> None:
        q = self.query.strip()
        if not q:
            self.matches = []
            return
        ids = self.trace.name_ids_matching(q)
        if not len(ids):
            self.matches = []
            return
        t = self.trace
        calls, total, _ = t._aggregate(np.isin(t.name_id, ids) & t.is_span)
        order = ids[np.argsort(-total[ids], kind="stable")][:20]
        self.matches = [[shorten(t.names[k], MAX_NAME), int(calls[k]), float(total[k])] for k in order]

    # -- without a front end ---------------------------------------------------------------------
    def summary_table(self) -> Table:
        t0, t1 = self._window()
        rows = [[n, c, tot, s] for n, c, tot, s in self._ops_in_window(t0, t1)]
        return Table(
            f"Top {len(rows)} ops by self time in view ({fmt_ns(t0)} to {fmt_ns(t1)})",
            ["name", "calls", "total", "self"],
            rows,
            {"total": fmt_ns, "self": fmt_ns},
        )

    def text_summary(self) -> str:
        lines = [repr(self.trace)]
        if self.note:
            lines.append(f"Note: {self.note}")
        lines.append(repr(self.trace.steps))
        lines.append(repr(self.summary_table()))
        return "\n".join(lines)

    def html_summary(self) -> str:
        t0, t1 = self._window()
        note = (
            f"<div style='background:#fff3cd;padding:2px 6px;display:inline-block'>{html.escape(self.note)}</div>"
            if self.note
            else ""
        )
        return (
            "<div class='hpu-trace-static'>"
            f"<div><b>{html.escape(self.title)}</b>: {html.escape(repr(self.trace))}</div>{note}"
            f"<div>{html.escape(repr(self.trace.steps))}</div>"
            f"<div>{timeline_svg(self.trace, self.index, window=(t0, t1))}</div>"
            f"{self.summary_table()._repr_html_()}</div>"
        )

    def _ipython_display_(self) -> None:
        """The live viewer, then its snapshot (the whole trace's picture and table) for the saved notebook."""
        SnapshotDisplays().show(live_bundle(self, f"{self!r} (live viewer; its snapshot follows)"),
                                snapshot_bundle("TraceViewer", self.html_summary(), self.text_summary()))

    def _repr_mimebundle_(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        bundle = super()._repr_mimebundle_(**kwargs)
        data, meta = bundle if isinstance(bundle, tuple) else (bundle or {}, {})
        data = dict(data)
        data["text/plain"] = self.text_summary()
        data["text/html"] = self.html_summary()
        return data, meta

    def __repr__(self) -> str:
        return f"<TraceViewer {self.title}: {len(self.trace):,} events>"


def details_rows(event: dict[str, Any]) -> dict[str, Any]:
    """The details pane of one event: its name and (label, formatted value) rows, each value bounded in length."""
    rows = [
        ("name", event["name"]),
        ("category", event["category"]),
        ("track", event["track"]),
        ("step", "-" if event["step"] is None else f"#{event['step']}"),
        ("start", fmt_ns(event["start_us"] * 1000)),
        ("duration", fmt_ns(event["duration_us"] * 1000)),
        ("self time", fmt_ns(event["self_us"] * 1000)),
        ("nesting depth", str(event["depth"])),
    ]
    for key, value in (event.get("args") or {}).items():
        rows.append((f"args.{key}", value if isinstance(value, str) else json.dumps(value, default=str)))
    return {
        "index": event["index"],
        "name": shorten(event["name"], MAX_DETAIL_CHARS),
        "rows": [[shorten(str(k), 80), shorten(str(v), MAX_DETAIL_CHARS)] for k, v in rows],
    }


class _MagicArgs(argparse.ArgumentParser):
    """argparse that raises instead of exiting the kernel."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ValueError(message)


def _parser() -> argparse.ArgumentParser:
    p = _MagicArgs(prog="%hpu_trace", add_help=False)
    p.add_argument("path", nargs="?", default=".")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--text", action="store_true", help="print the text summary instead of opening the viewer")
    p.add_argument("--no-args", dest="keep_args", action="store_false", help="do not keep event args (less memory)")
    return p


def hpu_trace_magic(line: str = "") -> TraceViewer | None:
    """%hpu_trace [PATH] [--top N] [--text] [--no-args]: view a Chrome trace (.json / .json.gz) or a folder's newest.

    Bad input prints one clear line instead of a traceback (a magic is typed by hand).
    """
    try:
        args = _parser().parse_args(shlex.split(line))
    except ValueError as err:
        print(f"%hpu_trace: {err}. Usage: %hpu_trace [PATH] [--top N] [--text] [--no-args]")
        return None
    try:
        path = find_trace(args.path)
        if os.path.isdir(args.path):
            others = len(trace_files(args.path)) - 1
            print(f"%hpu_trace: {path} (the newest Chrome trace in {args.path}"
                  + (f"; {others} older one{'s' if others > 1 else ''} there)" if others else ")"))
        trace = load(path, keep_args=args.keep_args)
    except (FileNotFoundError, ValueError, OSError) as err:
        print(f"%hpu_trace: {err}")
        return None
    if args.text:
        print(repr(trace.summary(top=args.top)))
        return None
    return TraceViewer(trace, top=args.top)


register_trace_viewer(TraceViewer)  # HPUProfiler.show() finds it here (core never imports the notebook layer)

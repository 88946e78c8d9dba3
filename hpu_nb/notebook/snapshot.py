"""Static snapshots: what an hpu_nb widget leaves in a saved notebook for readers without a kernel.

A widget output is only a reference to a model that lives in the kernel: reopened later (JupyterLab with no kernel
or a new one, GitHub, nbviewer, `jupyter nbconvert --to html`) it shows "Error displaying widget: model not found" and
JupyterLab never falls back to another mime type of that output. So every hpu_nb widget is displayed as two outputs,
as plotly / bokeh leave a picture behind:

1. the live widget (widget view + a one-line text), which needs the kernel;
2. its snapshot: plain HTML (summary, inline SVG pictures, tables) + text, no JavaScript, refreshed when the state
   that matters changes (a run ends, the form changes).

While the live view is on screen its stylesheet hides the snapshot after it (`.jp-OutputArea-child:has(<live>) +
.jp-OutputArea-child:has(.hpu-snapshot)`, in each widget's CSS), so a reader with a kernel sees one picture; without
the kernel that stylesheet is never loaded and the snapshot shows. The rule covers JupyterLab / Notebook 7 and the
classic notebook's output areas; front ends with other markup (VS Code) or without `:has()` show both.
"""

from __future__ import annotations

import html
import time
from typing import Any

from IPython.display import display
from ipywidgets import Widget

SNAPSHOT_CLASS = "hpu-snapshot"


def snapshot_bundle(kind: str, body_html: str, text: str) -> dict[str, str]:
    """The mime bundle of a snapshot: HTML (no script) wrapped so the live view's CSS can find it, and plain text."""
    when = time.strftime("%Y-%m-%d %H:%M")
    caption = (f'<div class="hpu-snapshot-caption" style="color:#777;font-size:11px;margin-top:2px">'
               f"{html.escape(kind)}: static snapshot ({when}); the live view needs the running kernel</div>")
    return {
        "text/plain": text,
        "text/html": (f'<div class="{SNAPSHOT_CLASS}" data-hpu-snapshot="{html.escape(kind)}">'
                      f"{body_html}{caption}</div>"),
    }


def live_bundle(widget: Any, text: str) -> dict[str, Any]:
    """The widget-view part of a widget's mime bundle, with a one-line text (the snapshot carries the summary)."""
    data = Widget._repr_mimebundle_(widget)  # ipywidgets' own: the view reference only, whatever a subclass adds
    view = data.get("application/vnd.jupyter.widget-view+json") if data else None
    return {"application/vnd.jupyter.widget-view+json": view, "text/plain": text} if view else {"text/plain": text}


class SnapshotDisplays:
    """The display handles of one widget's live view(s) and snapshot(s); `refresh` re-publishes the snapshots."""

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self.snapshots: list[Any] = []

    def show(self, live: dict[str, Any] | None, snapshot: dict[str, str]) -> None:
        """Display the live view (when there is one) and, after it, the snapshot."""
        if live and "application/vnd.jupyter.widget-view+json" in live:
            display(live, raw=True)
        handle = display(snapshot, raw=True, display_id=True)
        if handle is not None:
            self.snapshots = (self.snapshots + [handle])[-self.keep:]

    def refresh(self, snapshot: dict[str, str]) -> None:
        for handle in self.snapshots:
            handle.update(snapshot, raw=True)

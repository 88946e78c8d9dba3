"""TrainingChart: the live chart a MemoryMonitor owns (memory, loss and throughput over batches).

The chart is hand-written SVG in `static/training_chart.js` (shipped in the package: no CDN). bqplot would work
offline too, but it re-sends whole arrays on every update (no deltas, no binary buffers) and would add a dependency
for three small line charts.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anywidget
import traitlets

from hpu_nb.notebook.memory.history import STAGES
from hpu_nb.notebook.snapshot import SnapshotDisplays, live_bundle, snapshot_bundle

STATIC = Path(__file__).resolve().parent.parent / "static"


class TrainingChart(anywidget.AnyWidget):
    """The live view a MemoryMonitor owns: memory, loss and throughput over batches (JavaScript in static/)."""

    _esm = STATIC / "training_chart.js"
    _css = STATIC / "training_chart.css"

    uid = traitlets.Unicode().tag(sync=True)
    delta = traitlets.Dict().tag(sync=True)  # {"seq", "base", "reset", "points": pack_points([...FIELDS])}
    current = traitlets.Dict().tag(sync=True)  # the latest counters (all ten)
    ranks = traitlets.Dict().tag(sync=True)  # {"x": [...], "in_use": [[rank0, rank1, ...], ...], "max_in_use": [...]}
    status = traitlets.Unicode("idle").tag(sync=True)  # idle | running | done | oom | error
    stage = traitlets.Unicode("").tag(sync=True)
    device_label = traitlets.Unicode("").tag(sync=True)
    is_emulated = traitlets.Bool(False).tag(sync=True)
    oom = traitlets.Dict().tag(sync=True)  # {"x", "in_use", "limit", "requested", "message", "stage"}
    summary = traitlets.Unicode("").tag(sync=True)
    stages = traitlets.List(list(STAGES)).tag(sync=True)
    planned = traitlets.Dict().tag(sync=True)  # MemoryMonitor(plan=...): {"peak", "label", "mfu", "mfu_label"}

    def __init__(self, **traits: Any) -> None:
        super().__init__(**traits)
        # set by the owning MemoryMonitor: shows its live view + snapshot; False once the monitor is gone
        self.show_with_snapshot: Callable[[], bool] | None = None

    def _ipython_display_(self) -> None:
        """Displayed alone (`monitor.chart`), the chart shows as its monitor does: the live view, then the snapshot a
        saved notebook keeps (refreshed when the run ends). Without its monitor: the live view and the text summary."""
        if self.show_with_snapshot is not None and self.show_with_snapshot():
            return
        text = self.summary or f"MemoryMonitor chart ({self.status}): no summary yet"
        SnapshotDisplays().show(live_bundle(self, "MemoryMonitor live chart"),
                                snapshot_bundle("MemoryMonitor", f"<pre>{html.escape(text)}</pre>", text))

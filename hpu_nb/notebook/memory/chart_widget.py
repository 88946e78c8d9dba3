"""TrainingChart: the live chart a MemoryMonitor owns (memory, loss and throughput over batches).

The chart is hand-written SVG in `static/training_chart.js` (shipped in the package: no CDN). bqplot would work
offline too, but it re-sends whole arrays on every update (no deltas, no binary buffers) and would add a dependency
for three small line charts.
"""

from __future__ import annotations

from pathlib import Path

import anywidget
import traitlets

from hpu_nb.notebook.memory.history import STAGES

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

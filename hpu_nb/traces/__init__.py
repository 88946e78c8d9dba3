"""Profiler traces: load Chrome-trace JSON fast into columns, summarise, compare.

Pure Python + numpy + msgspec: no Lightning, no IPython. `load(path)` takes a .json /
.json.gz file or a folder (its newest trace).
"""

from hpu_nb.traces.compare import Comparison, compare
from hpu_nb.traces.load_warning import TraceLoadWarning
from hpu_nb.traces.model import (
    MemoryTimeline,
    Step,
    Steps,
    Trace,
    TraceSummary,
    Track,
    find_trace,
    load,
    trace_files,
)
from hpu_nb.traces.tables import Table

__all__ = [
    "Comparison",
    "MemoryTimeline",
    "Step",
    "Steps",
    "Table",
    "Trace",
    "TraceLoadWarning",
    "TraceSummary",
    "Track",
    "compare",
    "find_trace",
    "load",
    "trace_files",
]

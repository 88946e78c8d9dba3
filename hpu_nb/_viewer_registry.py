"""Where the layer that can draw a trace registers its viewer.

`HPUProfiler.show()` (hpu_nb.core) asks here for a viewer; the notebook layer fills the slot when it is imported
(hpu_nb.notebook.trace_viewer) or loaded (`%load_ext hpu_nb`). So core / runtime / traces never import the notebook
layer (IPython, anywidget), and a script without it gets a text summary instead of an import error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TraceViewerFactory = Callable[..., Any]  # (path, **options) -> a displayable viewer of that trace

_registered: TraceViewerFactory | None = None


def register_trace_viewer(factory: TraceViewerFactory | None) -> TraceViewerFactory | None:
    """Make `factory` the trace viewer (None removes it); returns the one it replaces."""
    global _registered
    previous, _registered = _registered, factory
    return previous


def registered_trace_viewer() -> TraceViewerFactory | None:
    """The registered trace viewer, or None when no layer that can draw one was loaded."""
    return _registered

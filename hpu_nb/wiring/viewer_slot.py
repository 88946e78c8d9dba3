"""Where the layer that can draw a trace registers its viewer.

`HPUProfiler.show()` (hpu_nb.core) asks here for a viewer; the layers above fill the slot: `import hpu_nb` registers an
opener that imports the notebook layer's TraceViewer on first use, hpu_nb.notebook.trace_viewer registers the class when
imported, `%load_ext hpu_nb` its opener. So core / runtime / traces never import the notebook layer (IPython,
anywidget), and where it cannot load, or nothing registered, show() gives a text summary instead of an import error.
A module of its own, importing nothing: `import hpu_nb` registers without loading hpu_nb.traces (numpy).
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

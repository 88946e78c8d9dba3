"""`%load_ext hpu_nb`: registers %hpu_info and %hpu_trace and an HTML view of the device backend.

Loading twice is harmless (the same functions are registered again); `%unload_ext hpu_nb` removes exactly what
loading added. In plain IPython the magics print text.
"""

from __future__ import annotations

from typing import Any

LINE_MAGICS = ("hpu_info", "hpu_trace")
TRACE_MODULE = "hpu_nb.notebook.trace_viewer"


def hpu_info_magic(line: str = "") -> None:
    """%hpu_info [--text] [--timeout S]: backend, devices, memory, versions and flags."""
    from hpu_nb.notebook.info import hpu_info

    hpu_info(line)


def hpu_trace_magic(line: str = "") -> Any:
    """%hpu_trace PATH: open a profiler trace in the inline viewer."""
    import importlib

    try:
        module = importlib.import_module(TRACE_MODULE)
    except ModuleNotFoundError as err:
        if err.name != TRACE_MODULE:
            raise
        print(
            f"%hpu_trace needs {TRACE_MODULE}, which this installation of hpu_nb does not have; "
            "update hpu_nb to get the trace viewer."
        )
        return None
    return module.hpu_trace_magic(line)


hpu_info_magic.__name__ = "hpu_info"
hpu_trace_magic.__name__ = "hpu_trace"


def _backend_html(backend: Any) -> str:
    import html

    kind = "emulated" if backend.is_emulated else "real"
    colour = "#fff3cd" if backend.is_emulated else "#d8f0dc"
    return (
        f'<span style="background:{colour};padding:2px 8px;border-radius:4px" data-hpu-backend="{kind}">'
        f"{html.escape(backend.describe())}</span>"
    )


def load_ipython_extension(ipython: Any) -> None:
    """Register the magics and the backend's HTML formatter (idempotent)."""
    from hpu_nb.runtime.base import DeviceBackend

    ipython.register_magic_function(hpu_info_magic, magic_kind="line", magic_name="hpu_info")
    ipython.register_magic_function(hpu_trace_magic, magic_kind="line", magic_name="hpu_trace")
    html_formatter = ipython.display_formatter.formatters.get("text/html")
    if html_formatter is not None:
        html_formatter.for_type(DeviceBackend, _backend_html)


def unload_ipython_extension(ipython: Any) -> None:
    """Remove what load_ipython_extension added; harmless when it was never loaded."""
    from hpu_nb.runtime.base import DeviceBackend

    line_magics = ipython.magics_manager.magics.get("line", {})
    for name in LINE_MAGICS:
        if name in line_magics and getattr(line_magics[name], "__module__", None) == __name__:
            del line_magics[name]
    html_formatter = ipython.display_formatter.formatters.get("text/html")
    if html_formatter is not None:
        html_formatter.pop(DeviceBackend, None)

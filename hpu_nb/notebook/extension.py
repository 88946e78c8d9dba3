"""`%load_ext hpu_nb`: registers %hpu_info, %hpu_trace and %hpu_plan, the HTML view of a Plan (hpu_nb.plan), an HTML
view of the device backend and the trace viewer HPUProfiler.show() opens (hpu_nb.wiring.viewer_slot), and makes HPU
Trainers print one line naming the backend instead of Lightning's GPU / TPU lines (`hpu_nb.core.trainer_output`).

What it registers is imported with it: loading calls trainer_output.install(), which brings Lightning anyway. Only
the trace viewer and the plan view wait until used (widgets; tracing).

Loading twice is harmless (the same functions are registered again); `%unload_ext hpu_nb` removes the magics and the
formatters. In plain IPython the magics print text.
"""

from __future__ import annotations

import html
import importlib
from typing import Any

from hpu_nb import _open_trace_viewer as open_trace_viewer  # the one opener; `import hpu_nb` registers it too
from hpu_nb.core import trainer_output
from hpu_nb.notebook.info import hpu_info
from hpu_nb.runtime.base import DeviceBackend
from hpu_nb.wiring.viewer_slot import register_trace_viewer, registered_trace_viewer

LINE_MAGICS = ("hpu_info", "hpu_trace", "hpu_plan")


def hpu_info_magic(line: str = "") -> None:
    """%hpu_info [--text] [--timeout S]: backend, devices, memory, versions and flags."""
    hpu_info(line)


def hpu_trace_magic(line: str = "") -> Any:
    """%hpu_trace PATH: open a profiler trace in the inline viewer."""
    from hpu_nb.notebook.trace_viewer import hpu_trace_magic as magic  # noqa: PLC0415 -- lazy: start-up cost (widgets)

    return magic(line)


def hpu_plan_magic(line: str = "") -> Any:
    """%hpu_plan MODEL BATCH [--devices N] [--strategy S] [--precision P] [--generation G] [--sweep 1,2,4]
    [--largest]: plan a Gaudi run of the notebook's MODEL before renting one (hpu_nb.plan)."""
    from hpu_nb.notebook.plan_view import hpu_plan_magic as magic  # noqa: PLC0415 -- lazy: tracing needs torch

    return magic(line)


def _plan_html(plan: Any) -> str:
    from hpu_nb.notebook.plan_view import plan_html  # noqa: PLC0415 -- lazy

    return plan_html(plan)


hpu_info_magic.__name__ = "hpu_info"
hpu_trace_magic.__name__ = "hpu_trace"
hpu_plan_magic.__name__ = "hpu_plan"


def _backend_html(backend: Any) -> str:
    kind = "emulated" if backend.is_emulated else "real"
    colour = "#fff3cd" if backend.is_emulated else "#d8f0dc"
    return (
        f'<span style="background:{colour};padding:2px 8px;border-radius:4px" data-hpu-backend="{kind}">'
        f"{html.escape(backend.describe())}</span>"
    )


# What %load_ext gave, said once per kernel (a newcomer otherwise finds the widget and the monitor only in the README).
LOADED = (
    "hpu_nb loaded: %hpu_info (the device), %hpu_trace PATH (a profiler trace), %hpu_plan MODEL BATCH (will it fit on a"
    " Gaudi: an estimate), hpu_nb.TrainerConfigWidget() (builds a Trainer and writes its code), hpu_nb.MemoryMonitor()"
    " in Trainer(callbacks=[...]) (live memory, loss, throughput)."
)


def load_ipython_extension(ipython: Any) -> None:
    """Register the magics and the backend's HTML formatter, quiet HPU Trainers' device lines (idempotent); the first
    time in a kernel, say in one line what that gave and put `hpu_nb` in the namespace if it is not there."""
    trainer_output.install()
    if registered_trace_viewer() is None:  # the TraceViewer class itself once trace_viewer.py was imported
        register_trace_viewer(open_trace_viewer)
    ipython.register_magic_function(hpu_info_magic, magic_kind="line", magic_name="hpu_info")
    ipython.register_magic_function(hpu_trace_magic, magic_kind="line", magic_name="hpu_trace")
    ipython.register_magic_function(hpu_plan_magic, magic_kind="line", magic_name="hpu_plan")
    html_formatter = ipython.display_formatter.formatters.get("text/html")
    if html_formatter is not None:
        html_formatter.for_type(DeviceBackend, _backend_html)
        html_formatter.for_type_by_name("hpu_nb.plan.planner", "Plan", _plan_html)  # by name: no import until shown
    ipython.user_ns.setdefault("hpu_nb", importlib.import_module("hpu_nb"))
    if not getattr(ipython, "_hpu_nb_said_loaded", False):
        ipython._hpu_nb_said_loaded = True
        print(LOADED)


def unload_ipython_extension(ipython: Any) -> None:
    """Remove what load_ipython_extension added; harmless when it was never loaded."""
    if registered_trace_viewer() is open_trace_viewer:
        register_trace_viewer(None)
    line_magics = ipython.magics_manager.magics.get("line", {})
    for name in LINE_MAGICS:
        if name in line_magics and getattr(line_magics[name], "__module__", None) == __name__:
            del line_magics[name]
    html_formatter = ipython.display_formatter.formatters.get("text/html")
    if html_formatter is not None:
        html_formatter.pop(DeviceBackend, None)
        html_formatter.pop("hpu_nb.plan.planner.Plan", None)

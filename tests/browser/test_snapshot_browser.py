"""In a real JupyterLab + Chromium: each hpu_nb widget (the monitor's chart, the trace viewer, the precision form) is
live while its kernel runs, with its static snapshot hidden. Saved, the notebook keeps the widgets' state (the lab's
`saveState` setting, binder/overrides.json, which `make lab` / `make browser` install into the venv), and reopened
after that kernel is gone every widget, Lightning's progress bar too, is drawn again from that state: no "Error
displaying widget: model not found" line, no console error. Where a front end saved no state, each widget's static
snapshot (summary, SVG pictures, code) shows in place of the live view. The precision form's code is not cut at the
panel's edge. Screenshots go to the artifacts folder (and docs/screenshots/ with HPU_NB_UPDATE_SCREENSHOTS=1)."""

from __future__ import annotations

import json
import urllib.request

import nbformat
from nbformat.sign import NotebookNotary

from tests.traces.test_trace_viewer import synthetic_events

CELLS = [
    """%load_ext hpu_nb
import warnings; warnings.filterwarnings("ignore")
import lightning as L, hpu_nb
from tests.helpers.models import LinearModel, regression_data
monitor = hpu_nb.MemoryMonitor(update_interval=0.1)
trainer = L.Trainer(accelerator="hpu", max_epochs=2, callbacks=[monitor], logger=False, enable_checkpointing=False,
                    enable_model_summary=False)
trainer.fit(LinearModel(64), regression_data(n=256, features=64))""",
    "from hpu_nb.notebook.trace_viewer import TraceViewer\nTraceViewer('small.pt.trace.json')",
    "hpu_nb.PrecisionConfigWidget(precision='fp8')",
]
LIVE = {0: ".hpu-tc", 1: ".hpu-trace", 2: ".hpu-cfg-panel"}

CODE_FITS = """(i) => {
  const cell = window.jupyterapp.shell.currentWidget.content.widgets[i].node;
  const pre = cell.querySelector('pre.hpu-cfg-code');
  const area = cell.querySelector('.jp-OutputArea');
  const a = pre.getBoundingClientRect(), b = area.getBoundingClientRect();
  return {scroll: pre.scrollWidth, client: pre.clientWidth, right: a.right, areaRight: b.right,
          overflow: getComputedStyle(pre).overflowX};
}"""


NO_WIDGET_ERRORS = "() => !document.body.innerText.includes('model not found')"


def _widget_errors(console: list[str]) -> list[str]:
    return [line for line in console if line.startswith(("error", "pageerror")) and "widget" in line.lower()
            or "model not found" in line.lower()]


def _setting_default(jupyter_lab, plugin: str, name: str) -> object:
    """A setting's default as the server gives it: the schema's, changed by the overrides.json files it reads."""
    with urllib.request.urlopen(jupyter_lab.url(f"lab/api/settings/{plugin}")) as response:
        return json.load(response)["schema"]["properties"][name]["default"]


def test_widgets_leave_snapshots_in_the_saved_notebook(lab, jupyter_lab) -> None:
    # the venv's lab settings (binder/overrides.json, installed by make lab / make browser, as on Binder)
    hint = "binder/overrides.json belongs in <venv>/share/jupyter/lab/settings/overrides.json (make lab installs it)"
    assert _setting_default(jupyter_lab, "@jupyter-widgets/jupyterlab-manager:plugin", "saveState") is True, hint
    assert _setting_default(jupyter_lab, "@jupyterlab/apputils-extension:notification", "fetchNews") == "false", hint
    (jupyter_lab.notebook_dir / "small.pt.trace.json").write_text(json.dumps({"traceEvents": synthetic_events(6, 12)}))
    jupyter_lab.write_notebook("snapshots.ipynb", CELLS)
    lab.open_notebook("snapshots.ipynb")
    lab.hide_side_panels()
    try:
        for i in range(len(CELLS)):
            lab.run_cell(i, timeout=180)
        # live: the widget is drawn, its snapshot is in the output but hidden
        for i, selector in LIVE.items():
            out = lab.cell(i).locator(".jp-OutputArea")
            out.locator(selector).first.wait_for(state="visible")
            assert out.locator(".hpu-snapshot").count() == 1, i
            assert not out.locator(".hpu-snapshot").is_visible(), f"cell {i}: the snapshot shows beside the widget"
        lab.page.wait_for_function(
            "() => document.querySelector('.hpu-tc') && document.querySelector('.hpu-tc').dataset.status === 'done'")
        fits = lab.page.evaluate(CODE_FITS, 2)
        # the code box ends inside the output; a line longer than the box scrolls in it, it is never cut
        assert fits["right"] <= fits["areaRight"] + 1 and fits["overflow"] == "auto", fits
        assert fits["scroll"] <= fits["client"] + 1, fits  # and the fp8 code's lines fit as they are
        lab.screenshot("snapshots-live")

        lab.page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
        lab.page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty")
        saved = json.loads((jupyter_lab.notebook_dir / "snapshots.ipynb").read_text())
        htmls = ["".join(o.get("data", {}).get("text/html", "")) for c in saved["cells"] for o in c.get("outputs", [])]
        kinds = [h.split('data-hpu-snapshot="')[1].split('"')[0] for h in htmls if "hpu-snapshot" in h]
        assert kinds == ["MemoryMonitor", "TraceViewer", "Precision configuration"], kinds
        # every view in the outputs (the progress bar's too) has its model's state saved with the notebook
        views = [o["data"]["application/vnd.jupyter.widget-view+json"]["model_id"] for c in saved["cells"]
                 for o in c.get("outputs", []) if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
        state = saved["metadata"]["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
        assert len(views) >= 4 and all(v in state for v in views), (views, sorted(state))
    finally:
        lab.save_console("snapshots-live")

    # the kernel that owned the widgets is gone: reopened, each widget is drawn from the saved state
    jupyter_lab.shutdown_kernels()
    lab.console.clear()
    lab.open_notebook("snapshots.ipynb")
    lab.hide_side_panels()
    try:
        for i, selector in LIVE.items():
            out = lab.cell(i).locator(".jp-OutputArea")
            out.locator(selector).first.wait_for(state="visible")
            assert not out.locator(".hpu-snapshot").is_visible(), f"cell {i}: the snapshot shows beside the widget"
        bar = lab.cell(0).locator(".jp-OutputArea .widget-progress, .jp-OutputArea .widget-output")
        assert bar.count() >= 1  # Lightning's progress bar came back as a widget
        assert lab.page.evaluate(NO_WIDGET_ERRORS), lab.page.locator("body").inner_text()[:2000]
        assert _widget_errors(lab.console) == [], _widget_errors(lab.console)
        lab.screenshot("notebook_reopened", lab.cell(0).locator(".jp-Cell-outputArea"))
    finally:
        lab.save_console("snapshots-reopened")

    # a front end that saves no widget state (saveState off, VS Code, nbconvert): each output shows its snapshot
    jupyter_lab.shutdown_kernels()
    path = jupyter_lab.notebook_dir / "snapshots.ipynb"
    notebook = nbformat.read(path, as_version=4)
    notebook.metadata.pop("widgets")
    NotebookNotary().sign(notebook)  # still the user's own outputs: trusted, as Lab's own save left them
    nbformat.write(notebook, path)
    lab.open_notebook("snapshots.ipynb")
    lab.hide_side_panels()
    try:
        for i in LIVE:
            snapshot = lab.cell(i).locator(".hpu-snapshot")
            snapshot.wait_for(state="visible")
            assert "static snapshot" in snapshot.inner_text()
            assert lab.cell(i).locator(LIVE[i]).count() == 0  # no live view: its model died with the kernel
        monitor = lab.cell(0).locator(".hpu-snapshot")
        assert "Peak (MaxInUse)" in monitor.inner_text() and "(done)" in monitor.inner_text()
        assert monitor.locator("svg polyline").count() >= 3  # InUse, MaxInUse, loss
        trace = lab.cell(1).locator(".hpu-snapshot")
        assert trace.locator("svg rect").count() > 10 and "aten::op" in trace.inner_text()
        assert "convert_modules(model" in lab.cell(2).locator(".hpu-snapshot").inner_text()
        # what the saved state spares a reader: JupyterLab's error line above each snapshot
        lab.page.wait_for_function("() => document.body.innerText.includes('model not found')")
        shot = lab.screenshot("notebook_snapshot", lab.cell(0).locator(".jp-OutputArea"))
        lab.publish(shot, "notebook_snapshot.png")
    finally:
        lab.save_console("snapshots-fallback")

"""Saved notebooks keep a picture of every hpu_nb widget: executed with nbclient, exported with nbconvert (with and
without the widget state nbclient stores), each widget's static snapshot is in the HTML, with no script in it."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import nbformat
import pytest

from tests.traces.test_trace_viewer import synthetic_events

CELLS = [
    """%load_ext hpu_nb
import warnings; warnings.filterwarnings("ignore")
import lightning as L, hpu_nb
from tests.helpers.models import LinearModel, regression_data
monitor = hpu_nb.MemoryMonitor(update_interval=0)
trainer = L.Trainer(accelerator="hpu", max_epochs=2, callbacks=[monitor], logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(LinearModel(32), regression_data(n=64, features=32))""",
    "from hpu_nb.notebook.trace_viewer import TraceViewer\nTraceViewer(TRACE)",
    "cfg = hpu_nb.TrainerConfigWidget(precision='bf16-mixed')\ncfg",
    "_ = cfg.set(strategy='ddp', devices=2)",  # the snapshot follows the form
    "monitor.chart",  # the chart displayed alone leaves the monitor's snapshot too
]
KINDS = ("MemoryMonitor", "TraceViewer", "Trainer configuration")


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> nbformat.NotebookNode:
    from nbclient import NotebookClient

    root = Path(__file__).resolve().parents[2]
    work = tmp_path_factory.mktemp("snap")
    trace = work / "small.pt.trace.json"
    trace.write_text(json.dumps({"traceEvents": synthetic_events(4, 12)}))
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src.replace("TRACE", repr(str(trace)))) for src in CELLS]
    env_before = dict(os.environ)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    os.environ["HPU_NB_BACKEND"] = "emulated"
    try:
        NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(work)}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    return nb


def _snapshots(nb: nbformat.NotebookNode) -> dict[str, str]:
    found = {}
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            html = out.get("data", {}).get("text/html", "")
            for kind in KINDS:
                if f'data-hpu-snapshot="{kind}"' in html:
                    found[kind] = html
    return found


def test_each_widget_output_is_followed_by_its_snapshot(executed: nbformat.NotebookNode) -> None:
    for index, kind in ((0, "MemoryMonitor"), (1, "TraceViewer"), (2, "Trainer configuration")):
        outputs = [o for o in executed.cells[index].outputs if o.output_type == "display_data"]
        views = [i for i, o in enumerate(outputs) if "application/vnd.jupyter.widget-view+json" in o.data]
        assert len(views) == 1, outputs
        after = outputs[views[0] + 1].data
        assert f'data-hpu-snapshot="{kind}"' in after["text/html"] and after["text/plain"].strip()
        assert "<script" not in after["text/html"].lower()
    snaps = _snapshots(executed)
    assert "Peak (MaxInUse)" in snaps["MemoryMonitor"] and "(done)" in snaps["MemoryMonitor"]
    assert snaps["MemoryMonitor"].count("<svg") >= 2  # memory and loss, drawn at the end of the run
    assert "<svg" in snaps["TraceViewer"] and "aten::op" in snaps["TraceViewer"]
    assert "strategy=&quot;hpu_ddp&quot;" in snaps["Trainer configuration"]  # re-published when the form changed


@pytest.mark.parametrize("widget_state", [True, False], ids=["with-widget-state", "without-widget-state"])
def test_nbconvert_html_shows_every_snapshot(executed: nbformat.NotebookNode, widget_state: bool) -> None:
    from nbconvert import HTMLExporter

    nb = copy.deepcopy(executed)
    if not widget_state:
        nb.metadata.pop("widgets", None)
    body, _ = HTMLExporter().from_notebook_node(nb)
    for kind in KINDS:
        assert f'data-hpu-snapshot="{kind}"' in body, kind
    assert "static snapshot" in body and "Peak (MaxInUse)" in body
    assert "model not found" not in body


def test_the_chart_displayed_alone_leaves_the_monitors_snapshot(executed: nbformat.NotebookNode) -> None:
    from nbconvert import HTMLExporter

    outputs = [o for o in executed.cells[4].outputs if o.output_type == "display_data"]
    views = [i for i, o in enumerate(outputs) if "application/vnd.jupyter.widget-view+json" in o.data]
    assert len(views) == 1, outputs
    after = outputs[views[0] + 1].data["text/html"]
    assert 'data-hpu-snapshot="MemoryMonitor"' in after and "Peak (MaxInUse)" in after and "(done)" in after
    assert after.count("<svg") >= 2 and "<script" not in after.lower()
    alone = copy.deepcopy(executed)
    alone.cells = [alone.cells[4]]
    alone.metadata.pop("widgets", None)  # reopened without the kernel's widget state
    body, _ = HTMLExporter().from_notebook_node(alone)
    assert 'data-hpu-snapshot="MemoryMonitor"' in body and "Peak (MaxInUse)" in body and "static snapshot" in body

"""In a real JupyterLab + Chromium: HPUProfiler + fit + profiler.show() draws the timeline; zoom, step selection,
search and click-for-details reach Python and come back; a hostile event name stays text. Screenshots go to the
artifacts folder (and docs/screenshots/ with HPU_NB_UPDATE_SCREENSHOTS=1)."""

from __future__ import annotations

import json
import time

HOSTILE = '<img src=x onerror="window.__hpu_xss=1">'

CELLS = [
    # 0: a short profiled fit on the emulated Gaudi, then the viewer
    """import tempfile, json
import lightning as L, torch
from torch.utils.data import DataLoader, TensorDataset
from hpu_nb import HPUProfiler

class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

data = DataLoader(TensorDataset(torch.randn(256, 64), torch.randint(0, 8, (256,))), batch_size=32)
profiler = HPUProfiler(dirpath=tempfile.mkdtemp(), filename="perf")
L.Trainer(accelerator="hpu", profiler=profiler, max_epochs=1, limit_train_batches=6, logger=False,
          enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False).fit(Net(), data)
viewer = profiler.show()
viewer""",
    # 1: the Python side of the widget, as JSON (read back by the test after each browser action)
    """print("STATE" + json.dumps({"view": viewer.view, "t0": viewer.payload_meta["t0"],
      "t1": viewer.payload_meta["t1"],
      "n": viewer.payload_meta["n"], "query": viewer.query, "selected": viewer.selected,
      "detail": viewer.details.get("name"), "steps": viewer.steps, "width": viewer.width}))""",
    # 2: a trace whose op name is markup
    f"""import pathlib
p = pathlib.Path(tempfile.mkdtemp()) / "hostile.json"
ev = [{{"ph": "X", "name": {HOSTILE!r}, "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 10.0 * i, "dur": 8.0}}
      for i in range(50)]
p.write_text(json.dumps({{"traceEvents": ev}}))
%load_ext hpu_nb
%hpu_trace {{p}}""",
    # 3: zoom the first viewer inside its longest op
    """import numpy as np
t = viewer.trace
i = int(np.argmax(np.where(t.op_mask, t.dur, 0)))
a = float(t.ts[i]) + 0.3 * float(t.dur[i])
viewer.view = [a, a + max(0.2 * float(t.dur[i]), 1000.0)]
print("INSIDE" + json.dumps({"name": t.names[t.name_id[i]], "ops": [r[0] for r in viewer.ops]}))""",
]


def _state(lab) -> dict:
    lab.run_cell(1)
    text = lab.cell_text(1)
    return json.loads(text[text.index("STATE") + 5 :].strip())


def _wait_state(lab, ok, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    state = _state(lab)
    while not ok(state) and time.monotonic() < deadline:
        time.sleep(0.5)
        state = _state(lab)
    assert ok(state), state
    return state


def test_trace_viewer_in_jupyterlab(lab, jupyter_lab) -> None:
    jupyter_lab.write_notebook("browser_trace.ipynb", CELLS)
    started = time.monotonic()
    lab.open_notebook("browser_trace.ipynb")
    lab.hide_side_panels()
    try:
        _check(lab)
    finally:
        lab.save_console("trace_viewer")
        lab.screenshot("trace-viewer-final")
    print(f"\nbrowser trace-viewer test took {time.monotonic() - started:.1f} s; screenshots in {lab.artifacts}")


def _check(lab) -> None:
    lab.run_cell(0, timeout=180)
    out = lab.cell(0)
    canvas = out.locator(".hpu-trace canvas")
    canvas.wait_for(state="visible", timeout=30_000)
    widget = out.locator(".hpu-trace")
    assert "emulated Gaudi, CPU activity only" in widget.locator(".hpu-trace-note").inner_text()
    lab.page.wait_for_function(
        "(el) => el.textContent.includes('spans in view')", arg=widget.locator(".hpu-trace-status").element_handle()
    )
    ops_text = widget.locator(".hpu-trace-ops").inner_text()
    assert "aten::" in ops_text
    box = canvas.bounding_box()
    assert box and box["width"] > 400 and box["height"] > 40
    # the front end told Python its real width
    state = _wait_state(lab, lambda s: s["width"] != 900)
    full = state["t1"] - state["t0"]
    # nothing is cut off on the right: the op table fits beside the timeline
    side = widget.locator(".hpu-trace-side")
    assert lab.page.evaluate("(el) => el.scrollWidth <= el.clientWidth + 1", side.element_handle())
    shot = lab.screenshot("trace-viewer", widget)
    lab.publish(shot, "trace_viewer.png")

    # zoom in with the wheel over the middle of the plot: Python answers with a narrower window
    lab.page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + 30)
    for _ in range(3):
        lab.page.mouse.wheel(0, -300)
        time.sleep(0.1)
    state = _wait_state(lab, lambda s: s["t1"] - s["t0"] < 0.8 * full)
    assert state["view"][1] - state["view"][0] < 0.8 * full

    # pick the first step in the list: the view becomes that step with 2% margins (kept inside the trace)
    widget.locator(".hpu-trace-steps").select_option(index=1)
    _, s0, s1 = state["steps"][0]
    state = _wait_state(lab, lambda s: abs((s["t1"] - s["t0"]) - 1.04 * (s1 - s0)) < 1e4)
    assert state["t0"] <= s0 and state["t1"] >= s1

    assert widget.get_attribute("data-step") == "0"  # the picker shows the step on view

    # hovering a span shows a tooltip; zooming out hides it and puts the picker back on "all steps"
    box = canvas.bounding_box()
    label_w = int(widget.get_attribute("data-label-w"))
    plot_w = box["width"] - label_w
    lab.page.mouse.move(box["x"] + label_w + plot_w / 2, box["y"] + 20 + 8)
    tip = widget.locator(".hpu-trace-tip")
    tip.wait_for(state="visible")
    assert "click for details" in tip.inner_text() and any(u in tip.inner_text() for u in ("us", "ms", "ns"))
    widget.locator(".hpu-trace-reset").click()
    tip.wait_for(state="hidden")
    assert widget.locator(".hpu-trace-steps").input_value() == "-1" and widget.get_attribute("data-step") == "-1"
    widget.locator(".hpu-trace-steps").select_option(index=1)
    _wait_state(lab, lambda s: abs((s["t1"] - s["t0"]) - 1.04 * (s1 - s0)) < 1e4)

    # click the middle of the first row (the main thread's top-level spans: ProfilerStep#N and Lightning's ranges):
    # the details are a table of formatted values
    lab.page.mouse.click(box["x"] + label_w + plot_w / 2, box["y"] + 20 + 8)
    state = _wait_state(lab, lambda s: s["selected"] >= 0 and s["detail"] is not None)
    assert state["detail"].startswith(("ProfilerStep#", "[pl]")), state["detail"]
    details = widget.locator(".hpu-trace-details table")
    details.wait_for()
    lab.page.wait_for_function(
        "(args) => args[0].textContent.includes(args[1])", arg=[details.element_handle(), state["detail"]]
    )
    cells = {r.locator("th").inner_text(): r.locator("td").inner_text() for r in details.locator("tr").all()}
    assert cells["name"] == state["detail"] and cells["duration"].endswith(("ms", "us")) and "{" not in cells["start"]
    lab.screenshot("trace-viewer-details", widget)

    # search: the matches list and the Python query follow the text box
    widget.locator(".hpu-trace-search").fill("addmm")
    lab.page.wait_for_function(
        "(el) => el.textContent.includes('aten::addmm')", arg=widget.locator(".hpu-trace-matches").element_handle()
    )
    assert _state(lab)["query"] == "addmm"
    lab.screenshot("trace-viewer-step-search", widget)
    widget.locator(".hpu-trace-search").fill("")

    # zoomed inside the longest op (no span starts in the window): the table lists what is in view, and the hover
    # gives that span's whole duration and the part in view
    lab.run_cell(3)
    inside = json.loads(lab.cell_text(3).split("INSIDE", 1)[1].strip())
    # the longest op may be a long Lightning span ("[pl][profile][Strategy]...backward"), cut in the middle in its
    # cell: its row is found by the whole name in the cell's title
    lab.page.wait_for_function(
        "(args) => [...args[0].querySelectorAll('td.hpu-trace-name')].some((td) => td.title === args[1])",
        arg=[widget.locator(".hpu-trace-ops").element_handle(), inside["name"]],
    )
    assert inside["name"] in inside["ops"]
    status = widget.locator(".hpu-trace-status").inner_text()
    assert "spans in view" in status and not status.startswith("0 spans")

    # a hostile name is shown as text and never runs
    lab.run_cell(2, timeout=60)
    hostile = lab.cell(2).locator(".hpu-trace")
    hostile.locator("canvas").wait_for(state="visible", timeout=30_000)
    # a long name is cut in the middle in the table (issue 39: the ends tell spans apart), whole in its title
    lab.page.wait_for_function(
        "(el) => [...el.querySelectorAll('td.hpu-trace-name')].some((td) => (td.title || '').includes('onerror'))",
        arg=hostile.locator(".hpu-trace-ops").element_handle()
    )
    titles = hostile.locator(".hpu-trace-ops td.hpu-trace-name").evaluate_all("(tds) => tds.map((td) => td.title)")
    assert HOSTILE in titles, titles
    shown = hostile.locator(".hpu-trace-ops").inner_text()
    assert HOSTILE in shown or (HOSTILE[:14] in shown and HOSTILE[-20:] in shown), shown
    assert hostile.locator("img").count() == 0
    time.sleep(0.5)
    assert lab.page.evaluate("() => window.__hpu_xss") is None
    errors = [line for line in lab.console if line.startswith("pageerror") and "hpu" in line.lower()]
    assert not errors, errors

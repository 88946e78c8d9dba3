"""TraceViewer and the level-of-detail payload: bounded bytes on a large trace, correct counts, escaping,
headless output, the %hpu_trace function."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from hpu_nb import traces
from hpu_nb.notebook.trace_viewer import TraceViewer, hpu_trace_magic
from hpu_nb.traces.lod import FLAG_MATCH, FLAG_MERGED, ITEM_BYTES, TimelineIndex

HOSTILE = "<img src=x onerror=alert(1)>"
FULL_VIEW_BUDGET = 2_000_000  # bytes: the bound for a full zoom-out
JS = pathlib.Path(traces.__file__).parent.parent / "notebook" / "static" / "trace_viewer.js"


def synthetic_events(n_steps: int, ops_per_step: int = 60):
    """Steps of nested ops on a main thread, a second thread and a device track: about 3.5 events per op."""
    ev = [{"ph": "M", "name": "process_name", "pid": 7, "tid": 0, "args": {"name": "HPU 0"}}]
    t = 0.0
    for s in range(n_steps):
        step_len = ops_per_step * 10.0
        ev.append(
            {
                "ph": "X",
                "name": f"ProfilerStep#{s}",
                "cat": "user_annotation",
                "pid": 1,
                "tid": 1,
                "ts": t,
                "dur": step_len,
            }
        )
        for k in range(ops_per_step):
            a = t + k * 10.0
            name = HOSTILE if k == 7 else f"aten::op{k % 9}"
            ev.append({"ph": "X", "name": name, "cat": "cpu_op", "pid": 1, "tid": 1, "ts": a + 0.5, "dur": 8.0})
            ev.append(
                {"ph": "X", "name": "aten::empty", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": a + 1.0, "dur": 1.0}
            )
            if k % 2 == 0:
                ev.append(
                    {
                        "ph": "X",
                        "name": f"tpc_kernel{k % 5}",
                        "cat": "kernel",
                        "pid": 7,
                        "tid": 2,
                        "ts": a + 2,
                        "dur": 6.0,
                    }
                )
            if k % 3 == 0:
                ev.append({"ph": "X", "name": "dataloader", "cat": "cpu_op", "pid": 1, "tid": 9, "ts": a, "dur": 3.0})
        t += step_len + 20.0
    return ev


@pytest.fixture(scope="module")
def big_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("big") / "big.pt.trace.json"
    events = synthetic_events(n_steps=1000, ops_per_step=70)  # ~200k events
    path.write_text(json.dumps({"traceEvents": events}))
    trace = traces.load(path)
    assert len(trace) > 190_000
    return trace


def test_full_view_payload_is_bounded(big_trace):
    index = TimelineIndex(big_trace)
    width = 1600
    payload = index.view(0, big_trace.duration_ns, width)
    assert payload.nbytes < FULL_VIEW_BUDGET
    assert repr(payload).startswith(f"<ViewPayload {payload.meta['n']:,} items")
    assert payload.nbytes < 0.02 * len(big_trace) * 100  # far below shipping the events (100+ bytes each)
    n_rows = len(index.rows)
    assert payload.meta["n"] <= n_rows * width * 1.5
    cols = payload.columns()
    # every span is accounted for: drawn alone or counted inside a merged block
    spans = int(big_trace.is_span.sum())
    merged = (cols["flags"] & FLAG_MERGED).astype(bool)
    assert int(cols["ref"][merged].sum()) + int((~merged).sum()) == spans == payload.meta["spans_in_view"]
    # at full zoom-out the 1 us ops are far below a pixel: most of the view is merged blocks
    assert merged.sum() > 0.5 * payload.meta["n"]
    # many rows could blow the budget: the item cap coarsens instead
    capped = index.view(0, big_trace.duration_ns, 8000, max_items=5000)
    assert capped.meta["n"] <= 5000 * 1.05 and capped.meta["resolution_px"] > 1


def test_zoomed_view_sends_individual_spans(big_trace):
    index = TimelineIndex(big_trace)
    step = big_trace.steps[500]
    payload = index.view(step.start_ns, step.end_ns, 1200)
    cols = payload.columns()
    single = ~(cols["flags"] & FLAG_MERGED).astype(bool)
    names = {payload.meta["names"][str(i)] for i in cols["name"][single]}
    assert {"aten::op0", "tpc_kernel0", f"ProfilerStep#{step.number}", HOSTILE} <= names
    # exactly the spans of that step (+ none of its neighbours: steps are 20 us apart)
    in_step = big_trace.is_span & (big_trace.ts >= step.start_ns) & (big_trace.end <= step.end_ns)
    assert payload.meta["spans_in_view"] == int(in_step.sum())
    refs = cols["ref"][single]
    assert np.all(big_trace.ts[refs] >= step.start_ns)
    assert payload.nbytes < 100_000


def test_search_flags_matches(big_trace):
    index = TimelineIndex(big_trace)
    ids = big_trace.name_ids_matching("tpc_kernel3")
    step = big_trace.steps[3]
    payload = index.view(step.start_ns, step.end_ns, 1200, match_ids=ids)
    cols = payload.columns()
    flagged = (cols["flags"] & FLAG_MATCH).astype(bool)
    assert flagged.sum() == 7  # k % 2 == 0 and k % 5 == 3 for k < 70: k = 8, 18, ..., 68
    assert {payload.meta["names"][str(i)] for i in cols["name"][flagged]} == {"tpc_kernel3"}


def test_viewer_answers_view_search_and_click(big_trace):
    v = TraceViewer(big_trace)
    assert v.payload_meta["bytes"] < FULL_VIEW_BUDGET and len(v.payload) == ITEM_BYTES * v.payload_meta["n"]
    full_n = v.payload_meta["n"]
    step = big_trace.steps[10]
    v.view = [float(step.start_ns), float(step.end_ns)]
    assert v.payload_meta["t0"] == step.start_ns and v.payload_meta["n"] != full_n
    assert v.ops[0] == ["dataloader", 24, 72_000.0, 72_000.0]  # k % 3 == 0 for k < 70, 3 us each
    ops = {r[0]: r for r in v.ops}
    assert ops["aten::op0"][1:] == [8, 64_000.0, 56_000.0]  # 8 us each, 1 us of it in aten::empty
    v.query = "tpc_kernel"
    totals = [m[2] for m in v.matches]
    assert totals == sorted(totals, reverse=True)
    assert {m[0] for m in v.matches} == {f"tpc_kernel{i}" for i in range(5)}
    i = int(np.flatnonzero(np.array(big_trace.names)[big_trace.name_id] == "tpc_kernel1")[0])
    v.selected = i
    assert v.details["name"] == "tpc_kernel1" and ["duration", "6 us"] in v.details["rows"]
    assert ["category", "kernel"] in v.details["rows"] and ["nesting depth", "0"] in v.details["rows"]
    v.view = ["bad", None]  # garbage from a front end never raises out of the comm
    assert v.error == "" and v.payload_meta["t0"] == 0.0


def test_headless_bundle_escapes_names_and_has_picture(big_trace):
    v = TraceViewer(big_trace)
    data, _ = v._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in data
    html_out = data["text/html"]
    assert "<svg" in html_out and "<table" in html_out
    assert "<img" not in html_out and "&lt;img src=x onerror=alert(1)&gt;" in html_out
    assert len(html_out) < 400_000
    assert "Top" in data["text/plain"] and "Steps: 1000" in data["text/plain"]


@pytest.mark.parametrize("name", ["trace_viewer.js", "training_chart.js", "config_widget.js"])
def test_javascript_never_uses_html_sinks(name):
    src = (JS.parent / name).read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in src, sink
    assert "textContent" in src


def test_emulated_note_shown(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(
        json.dumps({"hpu_nb": {"note": "emulated Gaudi, CPU activity only"}, "traceEvents": synthetic_events(2, 5)})
    )
    v = TraceViewer(str(p))
    assert v.note == "emulated Gaudi, CPU activity only"
    data, _ = v._repr_mimebundle_()
    assert "emulated Gaudi, CPU activity only" in data["text/html"] and "emulated Gaudi" in data["text/plain"]


def test_hpu_trace_magic(tmp_path, capsys):
    d = tmp_path / "logs"
    d.mkdir()
    (d / "a.pt.trace.json").write_text(json.dumps({"traceEvents": synthetic_events(3, 5)}))
    v = hpu_trace_magic(f"{d} --top 5")
    assert isinstance(v, TraceViewer) and v.top == 5 and len(v.ops) == 5
    assert hpu_trace_magic(f"{d} --text --top 5") is None
    assert "Top 5 ops by self time" in capsys.readouterr().out
    assert hpu_trace_magic(f"{tmp_path / 'nope'}") is None
    assert "no trace file or folder" in capsys.readouterr().out
    assert hpu_trace_magic("--bogus") is None
    assert "unrecognized arguments: --bogus" in capsys.readouterr().out


def test_zoomed_inside_spans_the_table_and_hover_know_the_whole_spans(big_trace):
    """Zoomed inside an op (no span starts in the window), the table lists the spans in view, as the status counts
    them, and the payload carries each span's whole duration (the hover's), not only the part in view."""
    v = TraceViewer(big_trace)
    i = int(np.flatnonzero(big_trace.op_mask & (big_trace.dur >= 8_000))[0])  # an 8 us aten::op
    start, dur = float(big_trace.ts[i]), float(big_trace.dur[i])
    v.view = [start + 0.25 * dur, start + 0.25 * dur + 1_000.0]  # 1 us inside it
    names = {row[0] for row in v.ops}
    assert big_trace.names[big_trace.name_id[i]] in names and v.payload_meta["spans_in_view"] >= 1
    payload = v.last_payload
    cols = payload.columns()
    refs = list(cols["ref"])
    k = refs.index(i)
    visible = (cols["x1"][k] - cols["x0"][k]) * 1_000.0 / payload.meta["width"]
    assert cols["dur"][k] == pytest.approx(dur) and visible < 0.2 * dur
    assert "of it in view" in JS.read_text()  # the hover says both figures

"""Trace summaries against a trace computed by hand: busy time is a union, nested same-name spans are not counted
twice, metadata tracks are hidden, the dtype summary, honest labels; %hpu_trace picks Chrome traces only and bounds
what it sends to the browser."""

from __future__ import annotations

import json
import os
import time

import pytest

from hpu_nb import traces
from hpu_nb.notebook.trace_viewer import TraceViewer, hpu_trace_magic

US = 1000  # ns


def x(name, ts, dur, tid=1, pid=1, cat="cpu_op", types=None):
    event = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if types is not None:
        event["args"] = {"Input type": types}
    return event


BF16, FP32 = "c10::BFloat16", "float"
HAND_MADE = [
    {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}},
    {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "worker"}},
    x("ProfilerStep#1", 0, 100, cat="user_annotation"),
    x("aten::conv2d", 10, 50, types=[FP32]),  # [10, 60)
    x("aten::conv2d", 15, 40, types=[BF16]),  # [15, 55): nested in the conv2d above
    x("aten::convolution", 20, 30, types=[BF16, BF16]),  # [20, 50)
    x("aten::relu", 40, 40, types=[FP32]),  # [40, 80): overlaps conv2d without nesting
    x("aten::add", 90, 5, types=[BF16, FP32]),  # [90, 95)
    x("aten::mm", 0, 30, tid=2, types=[FP32, FP32]),  # [0, 30)
    x("aten::mm", 20, 30, tid=2, types=[FP32, FP32]),  # [20, 50): overlaps the first mm
    # the profiler's own rows: a window span, an iteration marker, an unnamed instant
    {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler", "ts": 0,
     "dur": 100},
    {"ph": "i", "s": "g", "name": "Iteration Start: PyTorch Profiler", "pid": "Traces",
     "tid": "Trace PyTorch Profiler", "ts": 0},
    {"ph": "i", "s": "t", "name": "marker", "pid": "", "tid": "", "ts": 1},
]


@pytest.fixture
def hand_made(tmp_path):
    path = tmp_path / "hand.pt.trace.json"
    path.write_text(json.dumps({"hpu_nb": {"note": "emulated Gaudi, CPU activity only"}, "traceEvents": HAND_MADE}))
    return traces.load(path)


def test_busy_time_is_the_union_of_op_intervals(hand_made):
    assert hand_made.duration_ns == 100 * US
    tracks = {row["track"]: row for row in hand_made.per_track()}
    assert sorted(tracks) == ["1 / main", "1 / worker"]  # the profiler's window, marker and unnamed rows are hidden
    assert tracks["1 / main"]["busy"] == (80 - 10 + 95 - 90) * US  # [10, 80) and [90, 95)
    assert tracks["1 / worker"]["busy"] == 50 * US  # [0, 30) and [20, 50) overlap: 50, not 60
    assert all(row["busy %"] <= 100.0 for row in tracks.values())
    assert "hidden" in hand_made.per_track().note


def test_totals_never_count_nested_same_name_spans_twice(hand_made):
    totals = hand_made.op_totals()
    assert totals["aten::conv2d"] == (2, 50 * US, (10 + 10) * US)  # 2 calls; total = the outer span only
    assert totals["aten::convolution"] == (1, 30 * US, 30 * US)
    assert totals["aten::relu"] == (1, 40 * US, 40 * US)
    assert totals["aten::mm"] == (2, 60 * US, 60 * US)  # two calls side by side (overlapping, not nested)
    on_main = {k: v for k, v in totals.items() if k != "aten::mm"}
    assert all(total <= hand_made.duration_ns for _, total, _ in on_main.values())
    by_total = hand_made.ops(by="total")
    assert by_total[0]["name"] == "aten::mm" and by_total.column("total")[:2] == [60 * US, 50 * US]
    viewer_ops = {row[0]: row for row in TraceViewer(hand_made)._ops_in_window(0, 100 * US)}
    assert viewer_ops["aten::conv2d"][1:] == [2, 50.0 * US, 20.0 * US]  # the viewer's table agrees


def test_idle_gaps_and_their_title(hand_made):
    gaps = hand_made.idle_gaps()
    assert gaps.rows == [[10 * US, "1 / main", 80 * US, "aten::relu", "aten::add"]]
    assert gaps.title.startswith("Idle gaps: the 1 longest")
    assert hand_made.idle_gaps(min_ns=20 * US).title == "Idle gaps: none of at least 20 us"


def test_dtype_summary_says_what_ran_in_bf16(hand_made):
    table = hand_made.dtypes()
    rows = {row["name"]: row for row in table}
    assert (rows["aten::conv2d"]["bf16"], rows["aten::conv2d"]["fp32"]) == (1, 1)
    assert rows["aten::convolution"]["bf16"] == 1 and rows["aten::add"]["bf16"] == 1  # lowest float input wins
    assert rows["aten::mm"]["fp32"] == 2 and rows["aten::relu"]["fp32"] == 1 and rows["aten::mm"]["bf16"] == 0
    assert table.note == "3 of 7 calls with float inputs ran in a low precision"
    assert "Op dtypes" in repr(hand_made.summary())


def test_every_table_says_emulated(hand_made):
    summary = hand_made.summary()
    for table in (summary.by_self, summary.by_total, summary.steps, summary.tracks, summary.dtypes):
        assert "emulated Gaudi" in table.title
    cmp = traces.compare(hand_made, hand_made, labels=("fp32", "bf16"))
    assert "measured on the emulated Gaudi, CPU activity only" in repr(cmp).splitlines()[0]
    assert "emulated Gaudi" in cmp.table.title


def test_click_details_are_a_formatted_table(hand_made):
    viewer = TraceViewer(hand_made)
    i = next(k for k in range(len(hand_made)) if hand_made.names[int(hand_made.name_id[k])] == "aten::relu")
    viewer.selected = i
    rows = dict(viewer.details["rows"])
    assert rows["start"] == "40 us" and rows["duration"] == "40 us" and rows["step"] == "#1"
    assert rows["track"] == "1 / main" and rows["args.Input type"] == '["float"]'


def test_folder_picks_the_newest_chrome_trace_and_names_it(tmp_path, capsys):
    logs = tmp_path / "logs"
    logs.mkdir()
    trace = logs / "fit.pt.trace.json"
    trace.write_text(json.dumps({"traceEvents": HAND_MADE}))
    old = time.time() - 100
    os.utime(trace, (old, old))
    (logs / "maxabs_quant.json").write_text(json.dumps({"mode": "QUANTIZE", "allowlist": {"types": ["Linear"]}}))
    os.mkfifo(logs / "x.json")  # a pipe named like a trace must not be opened (it would block)
    assert traces.find_trace(logs) == str(trace)
    assert traces.trace_files(logs) == [str(trace)]
    viewer = hpu_trace_magic(str(logs))
    assert isinstance(viewer, TraceViewer)
    assert f"%hpu_trace: {trace} (the newest Chrome trace in {logs})" in capsys.readouterr().out
    (logs / "fit.pt.trace.json").unlink()
    assert hpu_trace_magic(str(logs)) is None
    assert "no Chrome trace" in capsys.readouterr().out


def test_a_huge_op_name_is_not_sent_whole(tmp_path):
    huge = "aten::" + "x" * 10_000_000
    path = tmp_path / "huge.json"
    path.write_text(json.dumps({"traceEvents": [x(huge, 10 * k, 8) for k in range(5)] + [x("aten::mm", 60, 5)]}))
    viewer = TraceViewer(traces.load(path))
    viewer.query = "xxx"
    viewer.selected = 0
    sent = json.dumps([viewer.ops, viewer.matches, viewer.details, viewer.payload_meta])
    assert len(sent) < 10_000  # names are clipped in the table, the matches, the details and the drawing
    assert viewer.ops[0][0].startswith("aten::xxx") and viewer.ops[0][0].endswith("…")

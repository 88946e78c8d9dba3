"""hpu_nb.traces: loading Chrome traces (plain, gzipped, truncated, malformed), nesting, summaries, compare."""

from __future__ import annotations

import gzip
import json
import os
import time
import warnings

import numpy as np
import pytest

from hpu_nb import traces
from hpu_nb.traces import TraceLoadWarning
from hpu_nb.traces._parse import parse_file

HOSTILE = "<img src=x onerror=alert(1)>"


def kineto_like(events, **top):
    """A trace laid out like Kineto writes it: header keys, indented events, keys after the array."""
    doc = {"schemaVersion": 1, "deviceProperties": [], "displayTimeUnit": "ms", **top}
    head = json.dumps(doc, indent=2)[:-2]
    body = ",\n".join(json.dumps(e, indent=2) for e in events)
    return f'{head},\n  "traceEvents": [\n{body}\n  ],\n  "traceName": "t.json"\n}}\n'


def span(name, ts, dur, tid=1, pid=1, cat="cpu_op", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def memory(ts, allocated, device_type=0, device_id=-1):
    args = {
        "Total Allocated": allocated,
        "Total Reserved": 0,
        "Bytes": 8,
        "Device Type": device_type,
        "Device Id": device_id,
    }
    return {
        "ph": "i",
        "cat": "cpu_instant_event",
        "s": "t",
        "name": "[memory]",
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "args": args,
    }


def two_step_events():
    """Two steps; known nesting: step > linear > addmm > empty; plus a second thread and a device track."""
    ev = [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main thread"}},
        {"ph": "M", "name": "process_name", "pid": 9, "tid": 0, "args": {"name": "HPU 0"}},
    ]
    for k, base in enumerate((1000.0, 2000.0)):
        ev += [
            span(f"ProfilerStep#{k + 1}", base, 500.0, cat="user_annotation"),
            span("aten::linear", base + 10, 100.0, ext=k),
            span("aten::addmm", base + 20, 60.0),
            span("aten::empty", base + 25, 5.0),
            span("aten::relu", base + 200, 50.0),
            span("aten::relu", base + 50, 30.0, tid=2),  # another thread: never a child of linear
            span("mme_gemm", base + 30, 40.0, pid=9, tid=3, cat="kernel"),
            memory(base + 26, 1000 * (k + 1)),
        ]
    ev.append({"ph": "s", "id": 1, "pid": 1, "tid": 1, "ts": 1.0, "name": "flow", "cat": "fwdbwd"})
    return ev


@pytest.fixture
def trace_file(tmp_path):
    p = tmp_path / "run.pt.trace.json"
    p.write_text(kineto_like(two_step_events(), hpu_nb=json.dumps({"note": "emulated Gaudi, CPU activity only"})))
    return p


def test_load_columns_nesting_and_self_time(trace_file):
    t = traces.load(trace_file)
    assert len(t) == 16  # 14 spans + 2 memory instants; metadata and the flow event are not events
    assert t.stats.skipped == 1 and t.stats.malformed == 0
    assert [s.number for s in t.steps] == [1, 2]
    assert t.steps[0].duration_ns == 500_000
    ops = {r["name"]: r for r in t.ops("self", top=50)}
    # linear 100us contains addmm 60us, which contains empty 5us
    assert ops["aten::linear"]["total"] == 2 * 100_000 and ops["aten::linear"]["self"] == 2 * 40_000
    assert ops["aten::addmm"]["self"] == 2 * 55_000
    assert ops["aten::empty"]["self"] == 2 * 5_000
    assert ops["aten::relu"]["calls"] == 4 and ops["aten::relu"]["self"] == 4 * 40_000
    assert "ProfilerStep#1" not in ops  # step markers are not ops
    first = t.ops("self", top=1)[0]["name"]
    assert first == "aten::relu"
    i = int(np.flatnonzero(np.array(t.names)[t.name_id] == "aten::empty")[0])
    assert t.depth[i] == 3
    assert t.names[t.name_id[t.parent[i]]] == "aten::addmm"
    info = t.event(int(np.flatnonzero(np.array(t.names)[t.name_id] == "aten::linear")[0]))
    assert info["args"] == {"ext": 0} and info["step"] == 1 and info["duration_us"] == 100.0
    assert t.device_note == "emulated Gaudi, CPU activity only"
    assert t.metadata["traceName"] == "t.json"  # top-level keys after the events array are read too


def test_summaries_steps_tracks_gaps_memory(trace_file):
    t = traces.load(trace_file)
    steps = t.per_step()
    assert steps.column("ops") == [6, 6]
    assert steps[0]["top op by self time"] == "aten::relu (80 us)"  # 50 us + 30 us on two threads
    tracks = {r["track"]: r for r in t.per_track()}
    assert tracks["python 1 / main thread"]["busy"] == 2 * (100_000 + 50_000)  # ops: linear + relu, per step
    device = [r for r in tracks.values() if r["kind"] == "device"]
    assert len(device) == 1 and device[0]["busy"] == 2 * 40_000
    gaps = t.idle_gaps(top=3)
    assert gaps.column("gap") == [970_000, 960_000, 760_000]  # thread 2, the device, then the main thread
    assert gaps[2]["after"] == "aten::relu" and gaps[2]["at"] == 250_000
    mem = t.memory()
    assert len(mem) == 2 and mem.peak() == 2000
    assert mem.series["cpu"][:, 1].tolist() == [1000, 2000]
    text = repr(t.summary())
    for part in ("Top", "aten::addmm", "Steps (2)", "Tracks", "Idle gaps", "Memory"):
        assert part in text


def test_gzip_and_folder_picks_newest(tmp_path, trace_file):
    gz = tmp_path / "sub" / "later.json.gz"
    gz.parent.mkdir()
    with gzip.open(gz, "wt") as fh:
        fh.write(kineto_like(two_step_events()[:6]))
    old = time.time() - 100
    os.utime(trace_file, (old, old))
    t = traces.load(tmp_path)
    assert t.path == str(gz)
    assert len(t) == 3 and [s.number for s in t.steps] == [1]
    with pytest.raises(FileNotFoundError, match="no trace file or folder"):
        traces.load(tmp_path / "missing")


def test_empty_folder_and_not_a_trace(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(FileNotFoundError, match="no Chrome trace"):
        traces.load(tmp_path / "d")
    bad = tmp_path / "x.json"
    bad.write_text('{"hello": 1}')
    with pytest.raises(ValueError, match="not a Chrome trace"):
        traces.load(bad)


def test_bare_array_format_without_closing_bracket(tmp_path):
    p = tmp_path / "a.json"
    p.write_text("[" + ",".join(json.dumps(span(f"op{i}", i * 10.0, 5.0)) for i in range(5)))
    with pytest.warns(TraceLoadWarning):
        t = traces.load(p)
    assert len(t) == 5


@pytest.mark.parametrize("cut", [0.5, 0.9, 0.999])
def test_truncated_file_loads_complete_events_with_warning(tmp_path, cut):
    events = [span(f"op{i % 7}", i * 10.0, 5.0, seq=i) for i in range(3000)]
    text = kineto_like(events).encode()
    p = tmp_path / "crashed.json"
    p.write_bytes(text[: int(len(text) * cut)])
    with pytest.warns(TraceLoadWarning, match=r"ends early.*loaded [\d,]+ complete events"):
        t = traces.load(p)
    # every complete event is kept, none invented: the last one loaded is the last one fully present
    complete = sum(1 for e in events if json.dumps(e, indent=2).encode() in text[: int(len(text) * cut)])
    assert len(t) in (complete, complete - 1)
    assert len(t) > 0.9 * 3000 * cut - 50
    assert t.stats.truncated


def test_truncated_gzip(tmp_path):
    events = [span("op", i * 10.0, 5.0) for i in range(2000)]
    full = gzip.compress(kineto_like(events).encode())
    p = tmp_path / "crashed.json.gz"
    p.write_bytes(full[: len(full) // 2])
    with pytest.warns(TraceLoadWarning, match="ends early"):
        t = traces.load(p)
    assert 0 < len(t) < 2000


def test_malformed_events_skipped_and_counted(tmp_path):
    events = [span("good", i * 10.0, 5.0) for i in range(10)]
    events[3]["ts"] = "yesterday"
    events[5] = 42
    events[7] = {"ph": "X", "name": "no time"}
    p = tmp_path / "bad.json"
    p.write_text(kineto_like(events))
    with pytest.warns(TraceLoadWarning, match="skipped 3 malformed events"):
        t = traces.load(p)
    assert len(t) == 7 and t.stats.malformed == 3


def test_small_blocks_split_events_anywhere(tmp_path):
    """The streaming parser must give the same result whatever the block size (splits mid-event)."""
    events = [
        span(f"op{i % 5}", i * 3.0, 2.0, nested={"a": [{"b": i}], "c": "}, {"}, text="two  spaces\nand a newline")
        for i in range(400)
    ]
    p = tmp_path / "t.json"
    p.write_text(kineto_like(events))
    whole = parse_file(str(p))
    for block in (7, 64, 333, 4096):
        part = parse_file(str(p), block_size=block)
        assert len(part.ts_us) == 400 and not part.stats.truncated
        np.testing.assert_array_equal(part.ts_us, whole.ts_us)
        assert [part.names[i] for i in part.name_id] == [whole.names[i] for i in whole.name_id]
        # args survive the piecewise packing (and the squeezing of pretty-printed whitespace) intact
        for i in (0, 1, 57, 398, 399):
            assert part.args.get(i) == {"nested": {"a": [{"b": i}], "c": "}, {"}, "text": "two  spaces\nand a newline"}


def test_begin_end_pairs_become_spans(tmp_path):
    ev = [
        {"ph": "B", "name": "outer", "pid": 1, "tid": 1, "ts": 0},
        {"ph": "B", "name": "inner", "pid": 1, "tid": 1, "ts": 10},
        {"ph": "E", "pid": 1, "tid": 1, "ts": 30},
        {"ph": "E", "pid": 1, "tid": 1, "ts": 100},
        {"ph": "E", "pid": 1, "tid": 1, "ts": 200},
    ]
    p = tmp_path / "be.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    t = traces.load(p)
    ops = {r["name"]: r for r in t.ops(top=5)}
    assert ops["outer"]["total"] == 100_000 and ops["outer"]["self"] == 80_000
    assert t.stats.unmatched == 1


def test_hostile_names_escaped_in_every_html(tmp_path):
    ev = [span(HOSTILE, 0.0, 10.0), span("ProfilerStep#1", 0.0, 20.0), memory(1.0, 10)]
    ev.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": HOSTILE}})
    p = tmp_path / "h.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    t = traces.load(p)
    other = traces.load(p)
    outputs = [
        t.summary()._repr_html_(),
        t.ops()._repr_html_(),
        t.per_step()._repr_html_(),
        t.per_track()._repr_html_(),
        t.idle_gaps(min_ns=0)._repr_html_(),
        t.memory()._repr_html_(),
        traces.compare(t, other)._repr_html_(),
    ]
    for out in outputs:
        assert "<img" not in out
    assert "&lt;img src=x onerror=alert(1)&gt;" in outputs[0]
    assert HOSTILE in repr(t.summary())  # plain text keeps the name as it is


def test_compare_finds_what_got_slower(tmp_path):
    def run(relu_dur, n_steps):
        ev = []
        for k in range(n_steps):
            b = k * 1000.0
            ev += [
                span(f"ProfilerStep#{k}", b, 900.0),
                span("aten::relu", b + 1, relu_dur),
                span("aten::mm", b + 300, 100.0),
            ]
        p = tmp_path / f"r{relu_dur}_{n_steps}.json"
        p.write_text(json.dumps({"traceEvents": ev}))
        return str(p)

    cmp = traces.compare(run(100.0, 2), run(250.0, 4), labels=("fp32", "bf16"))
    assert cmp.per_step
    top = cmp.table[0]
    assert top["name"] == "aten::relu" and top["delta"] == pytest.approx(150_000)
    assert cmp.slower(1.1) == ["aten::relu"]
    assert "fp32" in repr(cmp) and "2.50x" in repr(cmp)


def test_result_reprs_are_plain_text(trace_file):
    t = traces.load(trace_file)
    assert repr(t).startswith("<Trace run.pt.trace.json: 16 events")
    assert "emulated Gaudi" in repr(t)
    assert repr(t.steps).startswith("Steps: 2 (#1..#2)")
    long = traces.Table("x", ["a"], [[i] for i in range(100)])
    assert "... 75 more rows ..." in repr(long) and "75 more rows" in long._repr_html_()


def test_warnings_only_when_something_is_wrong(trace_file):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        traces.load(trace_file)


def test_memory_per_device_and_counters_without_args(tmp_path):
    ev = [
        span("op", 0.0, 10.0),
        memory(1.0, 100, device_type=15, device_id=0),
        memory(2.0, 300, device_type=15, device_id=0),
        memory(3.0, 50),
        {"ph": "C", "name": "hbm", "pid": 1, "tid": 1, "ts": 4.0, "args": {"used": 7}},
    ]
    p = tmp_path / "m.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    t = traces.load(p, keep_args=False)
    mem = t.memory()
    assert mem.series["hpu:0"][:, 1].tolist() == [100, 300] and mem.series["hpu:0"][:, 0].tolist() == [1000, 2000]
    assert mem.peak("cpu") == 50 and mem.peak() == 300
    i = int(np.flatnonzero((np.array(t.names)[t.name_id] == "[memory]") & (t.ts == 2000))[0])
    assert t.event(i)["args"]["Total Allocated"] == 300  # read back from the memory columns: no args kept
    assert t.counters()["hbm.used"].tolist() == [[4000, 7]]
    assert "hpu:0" in repr(mem) and "<svg" in mem._repr_html_()

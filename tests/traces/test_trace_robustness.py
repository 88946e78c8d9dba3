"""hpu_nb.traces against hostile input: one bad event costs only itself, odd files never hang, every loss is told."""

from __future__ import annotations

import gzip
import json
import os
import threading
import warnings

import msgspec
import numpy as np
import pytest

from hpu_nb import traces
from hpu_nb.traces import TraceLoadWarning, reading
from hpu_nb.traces._parse import MAX_TIME_US, parse_file

N = 300
BAD_EVENTS = {
    "NaN": '{"ph": "X", "name": "bad", "ts": NaN, "dur": 1, "pid": 1, "tid": 2}',
    "Infinity": '{"ph": "X", "name": "bad", "ts": 5, "dur": Infinity, "pid": 1, "tid": 2}',
    "lone surrogate": '{"ph": "X", "name": "bad\\ud800", "ts": 5, "dur": 1, "pid": 1, "tid": 2}',
    "raw newline": '{"ph": "X", "name": "bad\nname", "ts": 5, "dur": 1, "pid": 1, "tid": 2}',
    "huge ts": '{"ph": "X", "name": "bad", "ts": 1e30, "dur": 1, "pid": 1, "tid": 2}',
    "huge dur": '{"ph": "X", "name": "bad", "ts": 5, "dur": 9.3e18, "pid": 1, "tid": 2}',
    "deep args": '{"ph": "X", "name": "bad", "ts": 5, "dur": 1, "pid": 1, "tid": 2, "args": {"a": '
    + "[" * 50_000
    + "]" * 50_000
    + "}}",
    "not an object": "[1, 2]",
    "wrong type": '{"ph": "X", "name": 7, "ts": 5, "dur": 1, "pid": 1, "tid": 2}',
}


def good_event(i: int) -> dict:
    return {"ph": "X", "name": f"op{i % 7}", "cat": "cpu_op", "ts": 10.0 * i, "dur": 4.0, "pid": 1, "tid": 2,
            "args": {"i": i, "nested": [{"a": [1, {"b": "},{"}]}]}}


def write_trace(path, events_text: list[str], indent: bool = False) -> None:
    sep = ",\n" if not indent else ",\n    "
    path.write_text('{"schemaVersion": 1, "traceEvents": [\n  ' + sep.join(events_text)
                    + '\n], "traceName": "t", "deviceProperties": [{"id": 0}, {"id": 1}]}\n')


def events_with(bad: str | None, at: list[int], n: int = N, indent: bool = False) -> list[str]:
    out = []
    for i in range(n):
        out.append(bad if (bad is not None and i in at) else json.dumps(good_event(i), indent=2 if indent else None))
    return out


def loaded_names_and_times(parsed) -> list[tuple[str, float]]:
    return sorted(zip([parsed.names[k] for k in parsed.name_id], parsed.ts_us.tolist()))


@pytest.mark.parametrize("kind", list(BAD_EVENTS))
@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("block_size", [64, 4096, 8 << 20])
def test_one_bad_event_anywhere_costs_only_itself(tmp_path, kind, where, block_size):
    at = {"first": 0, "middle": N // 2, "last": N - 1}[where]
    path = tmp_path / "bad.json"
    write_trace(path, events_with(BAD_EVENTS[kind], [at]))
    clean = tmp_path / "clean.json"
    write_trace(clean, events_with(None, []))
    parsed = parse_file(str(path), block_size=block_size)
    expected = parse_file(str(clean))
    assert parsed.stats.malformed == 1 and not parsed.stats.truncated and parsed.stats.trailing_bytes == 0
    keep = np.arange(N) != at
    assert loaded_names_and_times(parsed) == sorted(
        (n, t)
        for (n, t), k in zip(zip([expected.names[i] for i in expected.name_id], expected.ts_us.tolist()), keep)
        if k
    )
    assert parsed.top_level == {"schemaVersion": 1, "traceName": "t", "deviceProperties": [{"id": 0}, {"id": 1}]}


def test_the_warning_counts_every_bad_event_and_shows_one(tmp_path):
    path = tmp_path / "bad.json"
    bad_at = list(range(3, N, 25))
    write_trace(path, events_with(BAD_EVENTS["NaN"], bad_at, indent=True), indent=True)  # Kineto's pretty-printing
    with pytest.warns(TraceLoadWarning, match=rf"skipped {len(bad_at)} malformed events \(kept {N - len(bad_at)}\)"):
        trace = traces.load(path)
    assert len(trace) == N - len(bad_at) and trace.stats.malformed == len(bad_at)
    assert "NaN" in trace.stats.examples[0]


def test_huge_times_never_wrap_around(tmp_path):
    path = tmp_path / "huge.json"
    write_trace(path, events_with(BAD_EVENTS["huge ts"], [10]) + [BAD_EVENTS["huge dur"]])
    with pytest.warns(TraceLoadWarning, match="skipped 2 malformed events") as record:
        trace = traces.load(path)
    assert "1e+30" in str(record[0].message)
    assert len(trace) == N - 1
    assert trace.ts.min() >= 0 and trace.end.max() == int(10.0 * (N - 1) * 1000 + 4000)  # ns from the first event
    assert np.iinfo(np.int64).max > MAX_TIME_US * 1000 * 3  # the bound keeps every span inside int64 nanoseconds


def test_deep_args_of_a_kept_event_do_not_raise_when_shown(tmp_path):
    """Deep enough to pass the parser (it only skips over args), too deep to be decoded later in a deep stack."""
    deep = ('{"ph": "X", "name": "deep", "ts": 5, "dur": 1, "pid": 1, "tid": 2, "args": {"a": '
            + "[" * 900 + "]" * 900 + "}}")
    path = tmp_path / "deep.json"
    write_trace(path, [deep, json.dumps(good_event(1))])
    parsed = parse_file(str(path))
    index = parsed.names.index("deep")
    row = int(np.flatnonzero(parsed.name_id == index)[0])

    def recurse(depth: int):
        return parsed.args.get(row) if depth == 0 else recurse(depth - 1)

    assert isinstance(recurse(700), dict)  # decoded, or {} when the stack is too deep: never a RecursionError


def test_two_concatenated_documents_load_the_first_and_warn(tmp_path):
    path = tmp_path / "two.json"
    one = {"traceEvents": [good_event(i) for i in range(5)], "traceName": "a"}
    two = {"traceEvents": [good_event(i) for i in range(5, 9)], "traceName": "b"}
    path.write_text(json.dumps(one) + "\n" + json.dumps(two) + "\n")
    with pytest.warns(TraceLoadWarning, match=r"bytes after the end of the trace's JSON document were ignored"):
        trace = traces.load(path)
    assert len(trace) == 5 and trace.metadata == {"traceName": "a"}
    assert trace.stats.trailing_bytes == len(json.dumps(two))


@pytest.mark.parametrize("block_size", [64, 8 << 20])
def test_two_concatenated_documents_with_big_events(tmp_path, block_size):
    """The second document starts inside a block: the events array's end is found there, not in the next one."""
    path = tmp_path / "two.json"
    one = {"traceEvents": [good_event(i) for i in range(200)]}
    two = {"traceEvents": [good_event(i) for i in range(200, 400)]}
    path.write_text(json.dumps(one) + json.dumps(two))
    with pytest.warns(TraceLoadWarning, match="ignored"):
        parsed = parse_file(str(path), block_size=block_size)
    assert len(parsed.ts_us) == 200 and parsed.stats.malformed == 0 and not parsed.stats.truncated


def test_bare_array_with_trailing_data_warns(tmp_path):
    path = tmp_path / "bare.json"
    path.write_text(json.dumps([good_event(i) for i in range(4)]) + '{"x": 1}')
    with pytest.warns(TraceLoadWarning, match="8 bytes after the end"):
        assert len(traces.load(path)) == 4


def test_truncated_file_with_a_bad_event_reports_both(tmp_path):
    path = tmp_path / "cut.json"
    write_trace(path, events_with(BAD_EVENTS["NaN"], [100]))
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trace = traces.load(path)
    messages = " | ".join(str(w.message) for w in record)
    assert "the trace ends early" in messages and "skipped 1 malformed events" in messages
    assert 0 < len(trace) < N and trace.stats.truncated and trace.stats.malformed == 1


def test_a_fifo_is_refused_at_once_not_read(tmp_path):
    fifo = tmp_path / "x.json"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def load():
        try:
            traces.load(tmp_path)  # the folder's newest *.json is the FIFO
            outcome.append(None)
        except BaseException as err:
            outcome.append(err)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(timeout=60)  # generous: a regression hangs forever, so the thread is abandoned, not awaited
    if worker.is_alive():
        with open(fifo, "wb"):  # unblock the reader so the thread can end
            pass
        pytest.fail("loading a folder holding a FIFO blocked")
    assert isinstance(outcome[0], FileNotFoundError)  # the pipe is skipped: it is not a trace
    assert "no Chrome trace" in str(outcome[0])
    with pytest.raises(ValueError, match="x.json is a FIFO \\(named pipe\\), not a regular file"):
        traces.load(fifo)  # named directly: refused at once, never read
    with pytest.raises(ValueError, match="is a folder, not a regular file"):
        parse_file(str(tmp_path))


def test_a_corrupt_gzip_file_is_named_as_such(tmp_path):
    path = tmp_path / "t.json.gz"
    path.write_bytes(b"\x1f\x8b\x08\x00" + b"\x00" * 6 + b"this is not deflate data" * 10)
    with pytest.raises(ValueError, match=r"t.json.gz is a corrupt gzip file: nothing could be decompressed"):
        traces.load(path)


def test_a_gzip_file_corrupt_midway_loads_what_came_before(tmp_path, monkeypatch):
    monkeypatch.setattr(reading, "GZIP_READ_SIZE", 4096)  # a small file read in several steps, as a big one is
    path = tmp_path / "t.json.gz"
    raw = gzip.compress(json.dumps({"traceEvents": [good_event(i) for i in range(20_000)]}).encode(), 1)
    damaged = bytearray(raw)
    middle = len(damaged) // 2
    damaged[middle : middle + 64] = b"\xff" * 64
    path.write_bytes(bytes(damaged))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trace = traces.load(path)
    messages = " | ".join(str(w.message) for w in record)
    assert "the gzip data is corrupt from some point on" in messages
    assert 0 < len(trace) < 20_000


def test_an_empty_file_says_so(tmp_path):
    path = tmp_path / "empty.json"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="not a Chrome trace: the file is empty"):
        traces.load(path)


def test_msgspec_still_words_its_errors_as_the_parser_reads_them():
    """Tripwire: the parser reads the byte offset and the kind of a syntax error from msgspec's message."""
    with pytest.raises(msgspec.DecodeError, match=r"invalid character \(byte 7\)"):
        msgspec.json.decode(b'[{"a": NaN}]')
    with pytest.raises(msgspec.DecodeError, match=r"trailing characters \(byte \d+\)"):
        msgspec.json.decode(b'[{"a": 1}] , {"b": 2}')
    with pytest.raises(msgspec.DecodeError, match="Input data was truncated"):
        msgspec.json.decode(b'[{"a": 1}, {"b"')
    with pytest.raises(RecursionError):
        msgspec.json.decode(b"[" * 100_000 + b"]" * 100_000, type=list[msgspec.Raw])

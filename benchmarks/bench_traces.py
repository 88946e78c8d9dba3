"""Trace loading and viewer payload benchmark (hpu_nb.traces vs json.load), side by side in one run.

1. Profiles a real small model with torch.profiler (CPU activity, memory events) for a few steps.
2. Tiles that trace's events (shifted in time, steps renumbered) into a ~1M-event Chrome trace in a
   temp dir, one event per line (Kineto pretty-prints a little more; we strip that whitespace anyway).
3. Loads it with `json.load` and with `hpu_nb.traces.load`, each in a fresh subprocess (so peak RSS
   is clean), alternating, best of N; prints the time ratio and peak memory / file size.
4. Prints the bytes the viewer sends for the full view and for a zoomed (one-step) view.
5. Malformed events: a ~600k-event tile of the same trace, clean and with ONE bad event in its middle (NaN,
   Infinity, a lone surrogate, a raw newline, deeply nested args), loaded side by side: time and peak-memory ratios
   against the clean file (bound: <= 1.2x), and the events kept.
6. Gzip bombs (hostile files): a 2 MB .json.gz of zeros and a 4 MB .json.gz of whitespace inside "traceEvents"
   (about 2 GB and 4 GB decompressed): the answer, its time and the loader's peak memory (bounds: 60 s, 1.5 GB).

    .venv/bin/python benchmarks/bench_traces.py [--events 1000000] [--malformed-events 600000] [--repeat 2] [--keep DIR]
                                                [--bombs-only]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MEASURE = r"""
import json, resource, sys, time
import numpy as np
mode, path = sys.argv[1], sys.argv[2]
extra = {}
if mode.startswith("hpu_nb"):
    import hpu_nb.traces as traces
def rss_mb():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
base = rss_mb()
t = time.perf_counter()
if mode == "json":
    with open(path, "rb") as fh:
        doc = json.load(fh)
    n = len(doc["traceEvents"])
else:
    doc = traces.load(path, keep_args=(mode == "hpu_nb"))
    n = len(doc)
    extra["args_mb"] = doc._args.nbytes / 2**20 if doc._args is not None else 0.0
    extra["columns_mb"] = sum(v.nbytes for v in vars(doc).values() if isinstance(v, np.ndarray)) / 2**20
elapsed = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(dict(extra, seconds=elapsed, events=n, peak_mb=peak - base, held_mb=rss_mb() - base)))
"""


def profile_small_model(out_dir: str) -> str:
    """A real trace: a small MLP trained for a few steps under torch.profiler (CPU + memory events)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = os.path.join(out_dir, "small.pt.trace.json")
    with profile(
        activities=[ProfilerActivity.CPU],
        profile_memory=True,
        record_shapes=True,
        schedule=schedule(wait=0, warmup=1, active=5),
        on_trace_ready=lambda p: p.export_chrome_trace(path),
    ) as prof:
        for _ in range(6):
            x = torch.randn(64, 128)
            loss = torch.nn.functional.cross_entropy(model(x), torch.randint(0, 10, (64,)))
            loss.backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    return path


def tile_trace(src: str, dst: str, target_events: int) -> int:
    """Repeat the events of `src` shifted in time until about `target_events`; Kineto's layout. Returns events."""
    with open(src) as fh:
        doc = json.load(fh)
    events = doc.pop("traceEvents")
    meta = [e for e in events if e.get("ph") == "M"]
    body = [e for e in events if e.get("ph") != "M" and "ts" in e]
    t0 = min(e["ts"] for e in body)
    span = max(e["ts"] + e.get("dur", 0) for e in body) - t0 + 5.0
    # serialise each event once, with placeholders for what changes per copy
    templates = []
    for e in body:
        e = dict(e)
        ts = e["ts"] - t0
        step = None
        if str(e.get("name", "")).startswith("ProfilerStep#"):
            step = int(e["name"].split("#")[1])
            e["name"] = "@@NAME@@"
        e["ts"] = "@@TS@@"
        text = "  " + json.dumps(e).replace('"@@TS@@"', "{ts:.3f}").replace('"@@NAME@@"', '"ProfilerStep#{step}"')
        templates.append(
            (
                text.replace("{", "{{")
                .replace("}", "}}")
                .replace("{{ts:.3f}}", "{ts:.3f}")
                .replace("{{step}}", "{step}"),
                ts,
                step,
            )
        )
    copies = max(1, target_events // len(body))
    head = {k: v for k, v in doc.items() if k != "traceName"}
    n = len(meta)
    with open(dst, "w") as out:
        out.write(json.dumps(head, indent=2)[:-2] + ',\n  "traceEvents": [\n')
        out.write(",\n".join("  " + json.dumps(e) for e in meta))
        steps_per_copy = 10
        for c in range(copies):
            base = t0 + c * span
            out.write(",\n")
            out.write(
                ",\n".join(
                    tpl.format(ts=base + ts, step=(c * steps_per_copy + step) if step is not None else 0)
                    for tpl, ts, step in templates
                )
            )
            n += len(templates)
        out.write('\n  ],\n  "traceName": "tiled"\n}\n')
    return n


BAD_EVENTS = {
    "NaN": '{"ph": "X", "name": "bad", "cat": "cpu_op", "ts": NaN, "dur": 1, "pid": 1, "tid": 1}',
    "Infinity": '{"ph": "X", "name": "bad", "cat": "cpu_op", "ts": 1, "dur": Infinity, "pid": 1, "tid": 1}',
    "lone surrogate": '{"ph": "X", "name": "bad\\ud800", "cat": "cpu_op", "ts": 1, "dur": 1, "pid": 1, "tid": 1}',
    "raw newline": '{"ph": "X", "name": "bad\nname", "cat": "cpu_op", "ts": 1, "dur": 1, "pid": 1, "tid": 1}',
    "nested args": '{"ph": "X", "name": "bad", "ts": 1, "dur": 1, "pid": 1, "tid": 1, "args": {"a": '
    + "[" * 100_000
    + "]" * 100_000
    + "}}",
}


def with_one_bad_event(src: str, dst: str, bad: str) -> None:
    """Copy `src` (one event per line), replacing the event line in the middle of the file with `bad`."""
    with open(src) as fh:
        lines = fh.readlines()
    middle = len(lines) // 2
    while not lines[middle].startswith("  {"):
        middle += 1
    lines[middle] = "  " + bad + ("," if lines[middle].rstrip().endswith(",") else "") + "\n"
    with open(dst, "w") as out:
        out.writelines(lines)


BOMB_LOAD = r"""
import json, resource, sys, time
import hpu_nb.traces as traces
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
try:
    answer = f"loaded {len(traces.load(sys.argv[1])):,} events"
except ValueError as err:
    answer = f"refused: {str(err)[:90]}"
peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
print(json.dumps(dict(seconds=time.perf_counter() - t, peak_mb=peak, answer=answer)))
"""


def write_bomb(path: str, head: bytes, filler: bytes, compressed_mb: float, tail: bytes) -> int:
    """A .gz of about `compressed_mb` MB that is `head`, then `filler` repeated, then `tail`; returns its size."""
    import zlib

    compress = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = filler * ((1 << 20) // len(filler))
    with open(path, "wb") as fh:
        written = fh.write(compress.compress(head))
        while written < compressed_mb * 2**20:
            written += fh.write(compress.compress(block))
        fh.write(compress.compress(tail) + compress.flush())
    return os.path.getsize(path)


def gzip_bombs(work: str) -> None:
    event = b'{"name": "op", "ph": "X", "ts": 1, "dur": 1, "pid": 1, "tid": 1}'
    bombs = {
        "zeros, 2 MB": (b"", b"\0", 2, b""),
        "whitespace in traceEvents, 4 MB": (b'{"traceEvents": [' + event + b",", b" ", 4, event + b"]}"),
    }
    for name, (head, filler, mb, tail) in bombs.items():
        path = os.path.join(work, "bomb.json.gz")
        size = write_bomb(path, head, filler, mb, tail)
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        out = subprocess.run([sys.executable, "-c", BOMB_LOAD, path], capture_output=True, text=True, env=env,
                             check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"gzip bomb ({name}, {size / 2**20:.1f} MiB on disk): {r['answer']} in {r['seconds']:.1f} s, peak"
              f" +{r['peak_mb']:.0f} MiB  (bounds: 60 s, 1536 MiB)")
        os.remove(path)


def malformed_vs_clean(work: str, small: str, events: int, repeat: int) -> None:
    """Load time and peak memory of a trace with one bad event vs the same trace clean, side by side."""
    clean = os.path.join(work, "clean.pt.trace.json")
    n = tile_trace(small, clean, events)
    variants = {}
    for kind, bad in BAD_EVENTS.items():
        variants[kind] = os.path.join(work, f"bad_{len(variants)}.pt.trace.json")
        with_one_bad_event(clean, variants[kind], bad)
    size_mib = os.path.getsize(clean) / 2**20
    print(f"malformed events: {n:,}-event trace ({size_mib:.0f} MiB), one bad event in its middle")
    for kind, path in variants.items():
        runs: dict[str, list[dict]] = {"clean": [], "bad": []}
        for _ in range(repeat):
            runs["clean"].append(measure("hpu_nb", clean))
            runs["bad"].append(measure("hpu_nb", path))
        best = {k: min(r, key=lambda x: x["seconds"]) for k, r in runs.items()}
        c, b = best["clean"], best["bad"]
        print(
            f"  {kind:15s} time {b['seconds']:.2f} s vs {c['seconds']:.2f} s = {b['seconds'] / c['seconds']:.2f}x, "
            f"peak memory {b['peak_mb']:.0f} vs {c['peak_mb']:.0f} MiB = {b['peak_mb'] / c['peak_mb']:.2f}x  "
            f"(bound: <= 1.2x); events {b['events']:,} of {c['events']:,}"
        )
        os.remove(path)


def measure(mode: str, path: str) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, mode, path], capture_output=True, text=True, env=env, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"{mode} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--malformed-events", type=int, default=600_000, help="events of the malformed-vs-clean trace")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each loader (best is kept); 2+ on a busy machine")
    ap.add_argument("--keep", help="write the trace into this folder and keep it")
    ap.add_argument("--bombs-only", action="store_true", help="only the gzip bombs (part 6)")
    args = ap.parse_args()
    work = args.keep or tempfile.mkdtemp(prefix="hpu_nb_bench_traces_")
    os.makedirs(work, exist_ok=True)
    try:
        gzip_bombs(work)
        if args.bombs_only:
            return
        t = time.perf_counter()
        small = profile_small_model(work)
        big = os.path.join(work, "tiled.pt.trace.json")
        n = tile_trace(small, big, args.events)
        size_mb = os.path.getsize(big) / 2**20
        print(
            f"trace: {n:,} events, {size_mb:.0f} MiB (tiled from a real torch.profiler trace of a small MLP; "
            f"made in {time.perf_counter() - t:.1f} s)"
        )

        runs: dict[str, list[dict]] = {"json": [], "hpu_nb": [], "hpu_nb_noargs": []}
        for _ in range(args.repeat):
            for mode, results in runs.items():  # alternate, so all see the same machine state
                results.append(measure(mode, big))
        best = {m: min(r, key=lambda x: x["seconds"]) for m, r in runs.items()}
        js, ours, lean = best["json"], best["hpu_nb"], best["hpu_nb_noargs"]
        print(
            f"json.load:        {js['seconds']:.2f} s, peak +{js['peak_mb']:.0f} MiB "
            f"({js['peak_mb'] / size_mb:.2f}x file), {js['events']:,} events"
        )
        print(
            f"hpu_nb.traces:    {ours['seconds']:.2f} s, peak +{ours['peak_mb']:.0f} MiB "
            f"({ours['peak_mb'] / size_mb:.2f}x file), held after load {ours['held_mb']:.0f} MiB "
            f"(columns {ours['columns_mb']:.0f} MiB, args {ours['args_mb']:.0f} MiB), "
            f"{ours['events']:,} events kept (flow and metadata events are not timeline events)"
        )
        print(
            f"  keep_args=False: {lean['seconds']:.2f} s, peak +{lean['peak_mb']:.0f} MiB "
            f"({lean['peak_mb'] / size_mb:.2f}x file), held {lean['held_mb']:.0f} MiB"
        )
        ratio = ours["seconds"] / js["seconds"]
        print(
            f"load time ratio (hpu_nb / json.load): {ratio:.2f}  (bound: <= 1.5)  "
            f"[best of {args.repeat}; all: json {[round(r['seconds'], 2) for r in runs['json']]}, "
            f"hpu_nb {[round(r['seconds'], 2) for r in runs['hpu_nb']]}]"
        )
        print(
            f"peak memory / file size: hpu_nb {ours['peak_mb'] / size_mb:.2f}, json.load {js['peak_mb'] / size_mb:.2f}"
        )

        sys.path.insert(0, ROOT)
        from hpu_nb import traces
        from hpu_nb.traces.lod import TimelineIndex

        trace = traces.load(big)
        t = time.perf_counter()
        index = TimelineIndex(trace)
        t_index = time.perf_counter() - t
        width = 1600
        t = time.perf_counter()
        full = index.view(0, trace.duration_ns, width)
        t_full = time.perf_counter() - t
        step = trace.steps[len(trace.steps) // 2]
        t = time.perf_counter()
        zoom = index.view(step.start_ns, step.end_ns, width)
        t_zoom = time.perf_counter() - t
        print(f"viewer index: {t_index * 1000:.0f} ms for {len(index.rows)} rows")
        print(
            f"full view ({width} px): {full.nbytes:,} bytes ({full.meta['n']:,} items for "
            f"{full.meta['spans_in_view']:,} spans, {full.meta['merged']:,} merged), {t_full * 1000:.0f} ms  "
            f"(bound: < 2,000,000)"
        )
        print(
            f"zoomed view (one step, {fmt(step.duration_ns)}): {zoom.nbytes:,} bytes "
            f"({zoom.meta['n']:,} items for {zoom.meta['spans_in_view']:,} spans), {t_zoom * 1000:.0f} ms"
        )
        del trace, index
        os.remove(big)
        malformed_vs_clean(work, small, args.malformed_events, args.repeat)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def fmt(ns: float) -> str:
    from hpu_nb.traces.tables import fmt_ns

    return fmt_ns(ns)


if __name__ == "__main__":
    main()

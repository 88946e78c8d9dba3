"""Finding Chrome traces: a path itself, or the newest trace below a folder (sniffed, never taken by name alone)."""

from __future__ import annotations

import gzip
import os

TRACE_SUFFIXES = (".json", ".json.gz", ".pt.trace.json", ".pt.trace.json.gz")


def find_trace(path: str | os.PathLike[str]) -> str:
    """`path` itself unless it is a folder (the parser refuses what is not a regular file), else the newest Chrome
    trace below the folder.

    In a folder only regular *.json / *.json.gz files whose opening bytes hold a "traceEvents" key (or an event
    array) count: an fp8 measurement, a config or a pipe named x.json is never taken for a trace.
    """
    p = os.fspath(path)
    if not os.path.exists(p):
        raise FileNotFoundError(f"no trace file or folder at {p!r}")
    if not os.path.isdir(p):
        return p
    found = trace_files(p)
    if not found:
        raise FileNotFoundError(f"no Chrome trace (*.json or *.json.gz with \"traceEvents\") in folder {p!r}")
    return found[0]


def trace_files(folder: str | os.PathLike[str]) -> list[str]:
    """The Chrome traces below `folder`, newest first."""
    found = []
    for root, _dirs, files in os.walk(os.fspath(folder)):
        for f in files:
            full = os.path.join(root, f)
            if f.endswith((".json", ".json.gz")) and os.path.isfile(full) and _looks_like_chrome_trace(full):
                found.append((os.path.getmtime(full), full))
    return [f for _, f in sorted(found, reverse=True)]


SNIFF_BYTES = 1 << 20


def _looks_like_chrome_trace(path: str) -> bool:
    """Does the file open like a Chrome trace? Reads at most SNIFF_BYTES (decompressed); never raises."""
    try:
        with open(path, "rb") as fh:
            magic = fh.read(2)
        opener = gzip.open if magic == b"\x1f\x8b" else open
        with opener(path, "rb") as fh:
            head = fh.read(SNIFF_BYTES)
    except (OSError, EOFError):
        return False
    start = head.lstrip()[:1]
    return b'"traceEvents"' in head or (start == b"[" and b'"ph"' in head)

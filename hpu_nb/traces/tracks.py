"""The timeline's rows: one Track per (process, thread) pair, labelled, kinded (cpu / device) and sorted from the
trace's metadata events."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpu_nb.traces.tables import shorten

_DEVICE_WORDS = ("hpu", "gpu", "device", "stream", "gaudi", "mme", "tpc", "dma")


@dataclass(frozen=True)
class Track:
    """One timeline row group: a (process, thread) pair, a CPU thread or a device stream/engine."""

    index: int
    pid: Any
    tid: Any
    label: str
    kind: str  # "cpu" or "device" or "other"
    sort_key: tuple[Any, ...]


def make_tracks(keys: list[tuple[Any, Any]], meta: list[dict[str, Any]]) -> list[Track]:
    proc_name: dict[Any, str] = {}
    proc_label: dict[Any, str] = {}
    proc_sort: dict[Any, Any] = {}
    thread_name: dict[tuple[Any, Any], str] = {}
    thread_sort: dict[tuple[Any, Any], Any] = {}
    for m in meta:
        args, pid, tid = m["args"], m["pid"], m["tid"]
        if not isinstance(args, dict):
            continue
        if m["name"] == "process_name":
            proc_name[pid] = str(args.get("name", ""))
        elif m["name"] == "process_labels":
            proc_label[pid] = str(args.get("labels", ""))
        elif m["name"] == "process_sort_index":
            proc_sort[pid] = args.get("sort_index", 0)
        elif m["name"] == "thread_name":
            thread_name[(pid, tid)] = str(args.get("name", ""))
        elif m["name"] == "thread_sort_index":
            thread_sort[(pid, tid)] = args.get("sort_index", 0)
    tracks = []
    for i, (pid, tid) in enumerate(keys):
        pname = proc_name.get(pid, "")
        plabel = proc_label.get(pid, "")
        tname = thread_name.get((pid, tid), "")
        proc = " ".join(x for x in (plabel or pname, str(pid)) if x)
        label = f"{proc} / {tname or tid}" if (proc or tname or tid != "") else "(unnamed track)"
        text = f"{pid} {tid} {pname} {plabel} {tname}".lower()
        kind = "device" if any(w in text for w in _DEVICE_WORDS) else "cpu" if isinstance(tid, int) else "other"
        sort_key = (
            {"device": 0, "cpu": 1, "other": 2}[kind],
            _num(proc_sort.get(pid, pid)),
            _num(thread_sort.get((pid, tid), tid)),
            i,
        )
        tracks.append(Track(i, pid, tid, shorten(label, 80), kind, sort_key))
    return tracks


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float(abs(hash(str(value))) % 10**9)

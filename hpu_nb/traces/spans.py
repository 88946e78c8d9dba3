"""Span arithmetic on a trace's sorted columns: nesting (depth, parent, self time), outermost spans of a name, and
the length of a union of intervals. Pure numpy over arrays: no Trace needed."""

from __future__ import annotations

import numpy as np

from hpu_nb.traces.event_columns import PH_COMPLETE


def nesting(ph: np.ndarray, dur: np.ndarray, end: np.ndarray, track_id: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Depth, parent and self time of every span: a stack sweep done with vectorised pointer jumping.

    Within a track, spans sorted by (start, -duration): the parent of span i is the nearest earlier
    span that ends no earlier than i (it contains i). That is the "previous greater element" of the
    end times, which a stack finds one event at a time; here every span starts with the candidate
    i-1 and all spans jump together (candidate <- candidate's candidate) while the candidate ends
    too early, so the sweep costs a few numpy passes, not a Python loop over a million events. It
    also copes with spans that overlap without nesting (Lightning's [pl][profile] ranges): they get
    the nearest span that truly contains them. Self time is the duration minus the children's.
    Instants and zero-length events get depth -1 and no self time; 1 ns of slack absorbs rounding.
    """
    n = len(ph)
    depth = np.full(n, -1, np.int32)
    parent = np.full(n, -1, np.int64)
    idx = np.flatnonzero((ph == PH_COMPLETE) & (dur > 0))
    m = len(idx)
    if m:
        e = end[idx]
        trk = track_id[idx]
        cand = np.arange(-1, m - 1, dtype=np.int64)
        cand[np.r_[True, trk[1:] != trk[:-1]]] = -1  # the first span of each track has no candidate
        active = np.flatnonzero(cand >= 0)
        while len(active):
            c = cand[active]
            too_early = e[c] < e[active] - 1
            active = active[too_early]
            cand[active] = cand[c[too_early]]
            active = active[cand[active] >= 0]
        d = np.zeros(m, np.int32)
        has = np.flatnonzero(cand >= 0)
        for _ in range(m):  # depth = parent's depth + 1; as many passes as the deepest nesting
            nd = d[cand[has]] + 1
            if np.array_equal(nd, d[has]):
                break
            d[has] = nd
        depth[idx] = d
        parent[idx[has]] = idx[cand[has]]
    is_span = depth >= 0
    self_ns = np.where(is_span, dur, 0).astype(np.int64)
    child = np.flatnonzero(parent >= 0)
    if len(child):
        self_ns -= np.bincount(parent[child], weights=dur[child], minlength=n).astype(np.int64)
    return depth, parent, np.maximum(self_ns, 0)


def outermost_of_name(is_span: np.ndarray, parent: np.ndarray, name_id: np.ndarray) -> np.ndarray:
    """True for spans with no enclosing span of the same name (walks every ancestor chain, one level per pass)."""
    outermost: np.ndarray = is_span.copy()
    idx = np.flatnonzero(parent >= 0)
    anc = parent[idx]
    while len(idx):
        same = name_id[anc] == name_id[idx]
        outermost[idx[same]] = False
        idx, anc = idx[~same], parent[anc[~same]]
        keep = anc >= 0
        idx, anc = idx[keep], anc[keep]
    return outermost


def union_ns(ts: np.ndarray, end: np.ndarray) -> int:
    """Length of the union of intervals [ts, end) given in start order: overlaps are counted once."""
    if not len(ts):
        return 0
    before = np.maximum.accumulate(end)  # the furthest any earlier interval reached
    before = np.r_[ts[0], before[:-1]]
    return int(np.maximum(end - np.maximum(ts, before), 0).sum())

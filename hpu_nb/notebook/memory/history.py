"""The monitor's samples: their layout (one list of floats per batch) and the bounded history that keeps them."""

from __future__ import annotations

import math
from typing import Any

STAGES = ("train", "validate", "sanity_check", "test", "predict")
# one sample: batch number, the three memory counters, stage index, epoch, loss (NaN when none), seconds since the
# previous batch (NaN for the first), samples in the batch, training batches it stands for (merged samples: several)
FIELDS = ("x", "Limit", "InUse", "MaxInUse", "stage", "epoch", "loss", "seconds", "samples", "batches")
X, LIMIT, IN_USE, MAX_IN_USE, STAGE, EPOCH, LOSS, SECONDS, SAMPLES, BATCHES = range(len(FIELDS))
NAN = float("nan")


class ChartHistory:
    """Bounded list of samples; halves itself when full, keeping the memory peak and the totals of time / samples."""

    def __init__(self, max_points: int = 600) -> None:
        if max_points < 4:
            raise ValueError(f"max_points must be at least 4, got {max_points}.")
        self.max_points = max_points
        self.points: list[list[float]] = []
        self.compactions = 0

    def __len__(self) -> int:
        return len(self.points)

    def append(self, point: list[float]) -> bool:
        """Add a sample; returns True when the history was downsampled (the front end then needs all of it)."""
        self.points.append(point)
        if len(self.points) <= self.max_points:
            return False
        pts = self.points
        kept = [_merge(a, b) for a, b in zip(pts[0::2], pts[1::2])]
        if len(pts) % 2:
            kept.append(pts[-1])
        self.points = kept
        self.compactions += 1
        return True

    def clear(self) -> None:
        self.points = []

    @property
    def peak(self) -> int:
        return int(max((p[MAX_IN_USE] for p in self.points), default=0))


def _merge(a: list[float], b: list[float]) -> list[float]:
    """Two neighbouring samples as one: the higher memory point, the peak of both, mean loss, summed time / samples."""
    merged = list(a if a[IN_USE] >= b[IN_USE] else b)
    merged[MAX_IN_USE] = max(a[MAX_IN_USE], b[MAX_IN_USE])
    merged[STAGE], merged[EPOCH] = b[STAGE], b[EPOCH]
    losses = [v for v in (as_float(a[LOSS]), as_float(b[LOSS])) if not math.isnan(v)]
    merged[LOSS] = sum(losses) / len(losses) if losses else NAN
    timed = [p for p in (a, b) if not math.isnan(p[SECONDS])]
    merged[SECONDS] = sum(p[SECONDS] for p in timed) if timed else NAN
    merged[SAMPLES] = sum(p[SAMPLES] for p in timed)
    merged[BATCHES] = sum(p[BATCHES] for p in timed)
    return merged


def as_float(value: Any) -> float:
    """A loss (a tensor until the next push), a counter or None as a float; NaN when it is none."""
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        return NAN

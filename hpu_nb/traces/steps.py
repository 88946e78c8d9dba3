"""The profiler's steps: ProfilerStep#N spans, one Step each, in a list with a readable repr."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from hpu_nb.traces.tables import fmt_ns

STEP_PATTERN = re.compile(r"^ProfilerStep#(\d+)$")


@dataclass(frozen=True)
class Step:
    """A ProfilerStep#N span."""

    number: int
    start_ns: int
    end_ns: int

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


class Steps(list[Step]):
    """The ProfilerStep#N spans of a trace, in time order (a list of Step with a readable repr)."""

    def __repr__(self) -> str:
        if not self:
            return "Steps: none (the trace has no ProfilerStep#N spans)"
        durs = np.array([s.duration_ns for s in self])
        return (
            f"Steps: {len(self)} (#{self[0].number}..#{self[-1].number}), "
            f"mean {fmt_ns(durs.mean())}, min {fmt_ns(durs.min())}, max {fmt_ns(durs.max())}"
        )

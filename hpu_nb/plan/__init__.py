"""Plan a Gaudi run before renting one: `hpu_nb.plan(model, batch, ...)` traces the training step on fake `hpu`
tensors and says, per card, what it holds at its peak, whether it fits, its FLOPs and a step-time estimate.

The layer sits between notebook/ (which draws plans) and core/ (whose precision rules the trace follows); it never
touches real device memory. `hpu_nb.plan` is this package and the function at once: calling the package calls
`plan()`, so `hpu_nb.plan(model, batch)` works however the package was first imported.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from hpu_nb.plan.fake_step import PlanError
from hpu_nb.plan.planner import DEFAULT_MARGIN, DEFAULT_MFU_BAND, Plan, plan, plan_batch_sizes, with_generation

__all__ = ["DEFAULT_MARGIN", "DEFAULT_MFU_BAND", "Plan", "PlanError", "plan", "plan_batch_sizes", "with_generation"]


class _CallablePackage(types.ModuleType):
    """`hpu_nb.plan(...)` on the package is `hpu_nb.plan.plan(...)`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Plan:
        return plan(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage

"""What a MemoryMonitor given a plan (`MemoryMonitor(plan=hpu_nb.plan(...))`) shows beside its measurements: the plan's
predicted per-card peak as a reference line beside the measured MaxInUse, and an MFU estimated from the plan's FLOPs.

Lightning's ThroughputMonitor needs the device's peak FLOPs from its own table, which has no Gaudi entry, and the
model's FLOPs per batch from the user; a plan already has both (FlopCounterMode's count of the step, and the
generation's published peak in hpu_nb.runtime.generations), so MFU = plan.flops_per_step / measured step time /
generation.peak_flops(precision). The FLOPs are the plan's (an estimate of the traced step), the step time is
measured: the figure is labelled "estimated from plan FLOPs".
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

MFU_LABEL = "MFU (estimated from plan FLOPs)"
PLANNED_LABEL = "planned peak (hpu_nb.plan, estimate)"


@dataclass(frozen=True)
class PlanReference:
    """The figures of a plan a monitor compares its measurements with."""

    peak_bytes: int  # the plan's per-card peak
    flops_per_step: int  # per card, forward + backward
    peak_flops: float  # the generation's published dense peak (FLOP/s) for the plan's precision
    generation: str  # "Gaudi2"
    precision: str
    description: str  # "DeepSpeed ZeRO-3 × 8, bf16-mixed, batch 32 per card, Gaudi2"

    def mfu(self, step_seconds: float) -> float | None:
        """flops_per_step / step_seconds / peak_flops; None without a positive step time or a known peak."""
        if not step_seconds > 0 or self.peak_flops <= 0:
            return None
        return self.flops_per_step / step_seconds / self.peak_flops

    def chart_traits(self, step_seconds: float | None) -> dict[str, Any]:
        """The live chart's `planned` trait: the reference line and the live MFU (null until a step is timed)."""
        mfu = None if step_seconds is None else self.mfu(step_seconds)
        return {"peak": self.peak_bytes, "label": f"{PLANNED_LABEL}: {self.description}",
                "mfu": mfu, "mfu_label": MFU_LABEL}


def plan_reference(plan: Any) -> PlanReference | None:
    """The reference of `plan` (an hpu_nb.plan.Plan, or None)."""
    if plan is None:
        return None
    # Not imported: the monitor is shared by both flavours (lightning, pytorch_lightning) and the planner imports
    # hpu_nb.core (lightning's); a Plan can only exist once hpu_nb.plan has been imported.
    plan_class = getattr(sys.modules.get("hpu_nb.plan"), "Plan", None)
    if plan_class is None or not isinstance(plan, plan_class):
        raise TypeError(f"plan must be an hpu_nb.plan.Plan (from hpu_nb.plan(model, batch, ...)), got "
                        f"{type(plan).__name__}.")
    gen = plan.generation
    return PlanReference(
        peak_bytes=plan.peak_bytes, flops_per_step=plan.flops_per_step, peak_flops=gen.peak_flops(plan.precision),
        generation=gen.label, precision=plan.precision,
        description=f"{plan.strategy}, {plan.precision}, batch {plan.batch_size} per card, {gen.label}",
    )

"""MemoryMonitor(plan=hpu_nb.plan(...)): the plan's predicted peak beside the measured MaxInUse (text, static SVG,
live chart trait) and an MFU from the plan's FLOPs over the monitor's own measured step times, on the emulated card."""

from __future__ import annotations

import statistics

import lightning as L
import pytest
from torch.utils.data import DataLoader

import hpu_nb
from hpu_nb.notebook.memory.history import BATCHES, SECONDS, STAGE
from hpu_nb.notebook.memory.planned import MFU_LABEL, PLANNED_LABEL, plan_reference
from hpu_nb.notebook.memory.summary import TrainingSummary
from hpu_nb.notebook.memory_monitor import MemoryMonitor
from hpu_nb.runtime.env import format_bytes
from hpu_nb.runtime.generations import GENERATIONS
from tests.helpers.models import quiet_trainer_kwargs
from tests.plan.measure import _Repeat
from tests.plan.models import MLP, batches

STEPS = 6


def test_a_fit_with_a_plan_shows_its_predicted_peak_and_the_mfu_of_the_measured_steps() -> None:
    model, batch = MLP(), batches("mlp", 32)
    planned = hpu_nb.plan(model, batch, precision="bf16-mixed")
    monitor = MemoryMonitor(plan=planned, auto_display=False)
    trainer = L.Trainer(accelerator="hpu", devices=1, precision="bf16-mixed", callbacks=[monitor],
                        **quiet_trainer_kwargs(max_steps=STEPS))
    trainer.fit(model, DataLoader(_Repeat(batch, STEPS), batch_size=None))

    summary = TrainingSummary(monitor)
    text = monitor.__repr__()
    # the predicted peak is the plan's, to the byte, and is said beside the measured MaxInUse
    assert summary.planned is not None and summary.planned.peak_bytes == planned.peak_bytes
    assert f"Planned peak {format_bytes(planned.peak_bytes)} per card (hpu_nb.plan, an estimate: " in text
    assert f"measured MaxInUse / planned = {monitor.peak / planned.peak_bytes:.3f}" in text

    # MFU = the plan's FLOPs / the median of the monitor's own recorded step times / the generation's peak
    timed = [p for p in monitor.history.points if p[STAGE] == 0 and p[BATCHES] > 0 and p[SECONDS] > 0]
    assert len(timed) >= STEPS - 1
    step = statistics.median(p[SECONDS] / p[BATCHES] for p in timed)
    expected = planned.flops_per_step / step / planned.generation.peak_flops("bf16-mixed")
    mfu, used_step = summary.mfu()
    assert used_step == step and mfu == pytest.approx(expected, rel=1e-12)
    assert f"{MFU_LABEL}: {100 * expected:.3g}% = {planned.flops_per_step:.4g} FLOPs per step / " in text
    assert f"{step * 1e3:.4g} ms median measured step time" in text
    assert "(emulated: CPU time and host memory)" in text  # a measurement on the emulated card says so

    # the static SVG draws the reference line and the legend names it; the live chart gets the same figures
    assert 'data-series="planned"' in summary.memory_svg()
    assert PLANNED_LABEL in summary.legend_html()
    live = monitor.chart.planned
    assert live["peak"] == planned.peak_bytes and live["mfu_label"] == MFU_LABEL
    assert live["mfu"] == pytest.approx(expected, rel=1e-12)
    assert "the plan is for" not in text

    # a plan for another generation than the card's: its MFU divides by that generation's peak, and says so
    monitor.plan_reference = plan_reference(hpu_nb.plan.with_generation(planned, "gaudi3"))
    other = TrainingSummary(monitor)
    gaudi3_peak = GENERATIONS["gaudi3"].peak_flops("bf16-mixed")
    assert other.mfu()[0] == pytest.approx(planned.flops_per_step / step / gaudi3_peak, rel=1e-12)
    assert "(the plan is for Gaudi3, the run is on Gaudi2" in other.text()


def test_without_a_plan_nothing_new_and_a_wrong_plan_is_refused_by_name() -> None:
    monitor = MemoryMonitor(auto_display=False)
    assert monitor.chart.planned == {} and TrainingSummary(monitor).planned_lines("") == []
    with pytest.raises(TypeError, match="plan must be an hpu_nb.plan.Plan"):
        MemoryMonitor(plan={"peak_bytes": 1})

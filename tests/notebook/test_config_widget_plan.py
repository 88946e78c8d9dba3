"""The config widget's live plan: with a model and a batch, each change of the form re-plans it with hpu_nb.plan and
shows the estimated per-card peak against the chosen Gaudi's HBM; an error of planning is the message shown, never
the form's. Driven from Python through the widgets' own controls (no browser)."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest
import torch
from typing_extensions import override

import hpu_nb
from hpu_nb.notebook.config_widget import TrainerConfigWidget
from hpu_nb.notebook.plan_verdict import PLANNING, verdict_text
from hpu_nb.runtime.generations import GENERATIONS
from tests.plan.models import MLP, batches

WAIT_S = 300  # generous: the machine is shared


class _ReadsAValue(MLP):
    """A step fake tensors cannot run: it reads the loss's value."""

    @override
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        if loss.item() > 1e9:
            raise AssertionError("unreachable")
        return loss


def test_each_change_of_the_form_replans_and_shows_hpu_nb_plans_verdict() -> None:
    model, batch = MLP(), batches("mlp", 16)
    widget = TrainerConfigWidget(model=model, batch=batch)
    assert widget.plan_state == "planning" and widget.plan_verdict == PLANNING  # the form did not wait for it
    widget.wait_for_plan(WAIT_S)
    alone = hpu_nb.plan(model, batch)
    assert widget.plan_state == "done"
    assert widget.plan.peak_bytes == alone.peak_bytes
    assert widget.plan_verdict == verdict_text(alone)
    assert "on 1 × " in widget.plan_verdict and ": fits (margin" in widget.plan_verdict

    # clicks, as the browser sends them: a burst plans the last state
    widget.controls["devices"].value = 2
    widget.controls["strategy"].value = "deepspeed"
    widget.controls["precision"].value = "bf16-mixed"
    widget.generation_control.value = "gaudi3"
    widget.wait_for_plan(WAIT_S)
    expected = hpu_nb.plan(model, batch, **widget.config.trainer_kwargs(), generation="gaudi3")
    assert expected.strategy == "DeepSpeed ZeRO-2 × 2" and expected.peak_bytes != alone.peak_bytes
    assert widget.plan.peak_bytes == expected.peak_bytes
    assert widget.plan_verdict == verdict_text(expected)
    assert f"on 2 × {GENERATIONS['gaudi3'].label}" in widget.plan_verdict
    # the text and HTML fallbacks carry the verdict
    assert widget.plan_verdict in repr(widget)
    assert widget.plan_verdict in widget._html()
    # the user's model was never swapped for fake tensors: the widget plans its own copy
    assert all(not p.is_meta and type(p.data) is torch.Tensor for p in model.parameters())


def test_an_invalid_form_or_a_step_that_cannot_be_planned_is_a_message_not_a_broken_form() -> None:
    widget = TrainerConfigWidget(model=_ReadsAValue(), batch=batches("mlp", 4))
    widget.wait_for_plan(WAIT_S)
    assert widget.plan_state == "error" and widget.plan is None
    assert "PlanError" in widget.plan_verdict and "if loss.item() > 1e9:" in widget.plan_verdict  # the op's line
    widget.controls["precision"].value = "bf16-mixed"  # the form still follows every change
    assert 'precision="bf16-mixed"' in widget.code

    good = TrainerConfigWidget(model=MLP(), batch=batches("mlp", 4))
    good.controls["devices"].value = 0  # an error of the form: its own message, the form untouched
    good.wait_for_plan(WAIT_S)
    assert good.plan_state == "error" and "devices" in good.plan_verdict
    assert any(i.field == "devices" for i in good.issues)
    good.controls["devices"].value = 4
    good.wait_for_plan(WAIT_S)
    assert good.plan_state == "done" and "on 4 × " in good.plan_verdict


def test_without_a_model_nothing_new_is_shown_and_plan_for_adds_the_verdict() -> None:
    widget = TrainerConfigWidget(devices=2)
    assert widget.plan_verdict == "" and "Plan (estimate)" not in repr(widget)
    assert widget._plan_box not in widget.children
    widget.plan_for(MLP(), batches("mlp", 8))
    assert widget._plan_box in widget.children
    widget.wait_for_plan(WAIT_S)
    assert "on 2 × " in widget.plan_verdict and widget.plan_verdict in repr(widget)


def test_the_verdict_says_when_the_peak_does_not_fit_or_eats_the_margin() -> None:
    planned = hpu_nb.plan(MLP(), batches("mlp", 4))
    hbm = planned.hbm_bytes
    over = dataclasses.replace(planned, breakdown={"activations": hbm + (3 << 30)})
    assert verdict_text(over).endswith("does not fit (over by 3.00 GiB)")
    tight = dataclasses.replace(planned, breakdown={"activations": int(hbm * 0.95)})
    assert "fits only without the 10% margin" in verdict_text(tight)


def test_a_burst_of_clicks_plans_once_for_the_last_state(monkeypatch: pytest.MonkeyPatch) -> None:
    import hpu_nb.notebook.plan_verdict as plan_verdict

    widget = TrainerConfigWidget(model=MLP(), batch=batches("mlp", 4))
    widget.wait_for_plan(WAIT_S)
    widget._planner._debounce_s = 2.0  # a quiet time no burst of four assignments outlasts, however loaded the box
    planned: list[dict] = []

    def counted(model: Any, batch: Any, **kwargs: Any) -> Any:  # the real planner, counted
        planned.append(kwargs)
        return hpu_nb.plan(model, batch, **kwargs)

    monkeypatch.setattr(plan_verdict, "plan", counted)
    for devices in (2, 3, 4, 8):
        widget.controls["devices"].value = devices
        assert widget.plan_state == "planning"
    widget.wait_for_plan(WAIT_S)
    assert [kwargs["devices"] for kwargs in planned] == [8]
    assert "on 8 × " in widget.plan_verdict


def test_plans_run_between_cells_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """IPython's pre_run_cell pauses the planner (a cell that starts waits for the plan in flight; none starts while it
    runs) and post_run_cell resumes it: the trace's module hooks are process-wide and must never see a cell's fit."""
    import hpu_nb.notebook.plan_verdict as plan_verdict

    widget = TrainerConfigWidget(model=MLP(), batch=batches("mlp", 4))
    planner = widget._planner
    planned: list[int] = []
    in_flight, release = threading.Event(), threading.Event()

    def counted(model: Any, batch: Any, **kwargs: Any) -> Any:  # the real planner, counted; 3 cards' plan held
        planned.append(kwargs["devices"])
        if kwargs["devices"] == 3:
            in_flight.set()
            release.wait(WAIT_S)
        return hpu_nb.plan(model, batch, **kwargs)

    monkeypatch.setattr(plan_verdict, "plan", counted)
    widget.controls["devices"].value = 3
    assert in_flight.wait(WAIT_S)  # the worker took this request: its plan is in flight
    cell = threading.Thread(target=planner.pause)  # a cell starts while it plans
    cell.start()
    cell.join(0.2)
    assert cell.is_alive() and widget.plan_state == "planning"  # the cell waits: the plan is held
    release.set()
    cell.join(WAIT_S)
    assert not cell.is_alive() and planner._worker is None
    assert widget.plan_state == "done" and "on 3 × " in widget.plan_verdict

    widget.controls["devices"].value = 2  # a change while the cell runs
    planner._timer.join()  # came due: it waits for the cell to end
    assert planner._worker is None and widget.plan_state == "planning" and planned[-1] == 3
    planner.resume()  # the cell ended
    widget.wait_for_plan(WAIT_S)
    assert planned[-1] == 2 and "on 2 × " in widget.plan_verdict

    planner.pause()
    widget.controls["devices"].value = 4
    assert "on 4 × " in widget.wait_for_plan(WAIT_S)  # a cell that waits for the plan lets it run
    assert planner._paused  # and the cell's pause holds again after it
    planner.resume()

"""The notebook view of a plan: %hpu_plan, its HTML (static SVG: a stacked bar against Gaudi 1/2/3's HBM, the sweep
with the largest batch) and its plain text."""

from __future__ import annotations

import pytest

import hpu_nb
from hpu_nb.notebook.plan_view import PlanView, hpu_plan_magic, plan_html
from tests.plan.models import MLP, Transformer, batches


def test_html_draws_each_category_against_every_generations_hbm() -> None:
    plan = hpu_nb.plan(Transformer(), batches("transformer", 4), precision="bf16-mixed")
    page = plan_html(plan)
    for key, value in plan.breakdown.items():
        assert (f'data-category="{key}"' in page) == (value > 0)
    assert all(f'data-hbm="{key}"' in page for key in ("gaudi", "gaudi2", "gaudi3"))
    assert "estimate" in page and "fits on 1 × Gaudi2" in page


def test_the_magic_plans_names_from_the_notebook_with_a_sweep_and_the_largest_batch() -> None:
    namespace = {"model": MLP(), "batch": batches("mlp", 4)}
    view = hpu_plan_magic("model batch --precision bf16-mixed --sweep 1,2,4 --largest --generation gaudi3",
                          namespace=namespace)
    assert isinstance(view, PlanView)
    assert [p.batch_size for p in view.sweep] == [1, 2, 4] and view.largest is not None and view.largest > 4
    page = view._repr_html_()
    assert 'data-plan="sweep"' in page and f'data-largest="{view.largest}"' in page
    text = repr(view)
    assert "largest batch that fits" in text and "Gaudi3" in text and "estimate" in text


def test_the_magic_names_what_is_missing(capsys: pytest.CaptureFixture[str]) -> None:
    assert hpu_plan_magic("model batch", namespace={}) is None
    assert "model, batch not defined" in capsys.readouterr().out
    assert hpu_plan_magic("--bogus", namespace={}) is None
    assert "%hpu_plan MODEL BATCH" in capsys.readouterr().out


def test_load_ext_registers_hpu_plan_and_shows_plans_as_the_view() -> None:
    interactive = pytest.importorskip("IPython.core.interactiveshell")
    shell = interactive.InteractiveShell.instance()
    shell.run_line_magic("load_ext", "hpu_nb")
    try:
        assert "hpu_plan" in shell.magics_manager.magics["line"]
        plan = hpu_nb.plan(MLP(), batches("mlp", 2))
        data, _ = shell.display_formatter.format(plan)
        assert 'data-hpu-plan="1"' in data["text/html"] and "estimate" in data["text/plain"]
    finally:
        shell.run_line_magic("unload_ext", "hpu_nb")
    assert "hpu_plan" not in shell.magics_manager.magics["line"]

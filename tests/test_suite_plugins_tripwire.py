"""The suite's own pytest plumbing leans on two plugins' internals: tests/helpers/notebook_runs.py replaces nbmake's
`NotebookRun` to keep each notebook nbmake executed for the tutorial tests, and tests/work_units.py subclasses
pytest-xdist's LoadScopeScheduling with its own `_split_scope`. Tripwires on both, and the behaviour itself."""

from __future__ import annotations

import inspect
from pathlib import Path

import nbformat
import pytest
from nbmake import pytest_items
from nbmake.nb_result import NotebookResult
from xdist.scheduler import LoadScopeScheduling

from tests.helpers import notebook_runs
from tests.work_units import LONGEST_FIRST, work_unit


def test_nbmake_items_still_run_notebooks_through_the_module_level_notebook_run() -> None:
    """If an nbmake upgrade stops looking `NotebookRun` up in pytest_items at run time, or stops returning the executed
    notebook, the tutorial tests would silently execute every notebook a second time: fail here instead."""
    runtest = inspect.getsource(pytest_items.NotebookItem.runtest)
    assert "NotebookRun(" in runtest and ".execute()" in runtest, runtest
    assert "nb" in inspect.signature(NotebookResult).parameters


def test_a_notebook_nbmake_executes_is_recorded_with_its_outputs(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pytest_items, "NotebookRun", pytest_items.NotebookRun)  # restored after the test
    monkeypatch.setattr(notebook_runs, "EXECUTED", {})
    notebook_runs.record_nbmake_runs()
    for name, source in (("answer", "print(6 * 7)"), ("broken", "raise ValueError('no')")):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, tmp_path / f"{name}.ipynb")
        result = pytest_items.NotebookRun(tmp_path / f"{name}.ipynb", 120).execute()
        assert (result.error is None) is (name == "answer")
    assert list(notebook_runs.EXECUTED) == ["answer"]  # a notebook that failed is not kept: the tests run it again
    assert notebook_runs.EXECUTED["answer"].cells[0].outputs[0]["text"] == "42\n"


def test_xdist_scope_scheduling_still_asks_split_scope_and_honours_the_reorder_switch() -> None:
    """If an xdist upgrade stops asking `_split_scope` for each test's unit, or reorders units regardless of
    `loadscopereorder`, modules would again be split across workers (or started in another order): fail here."""
    schedule = inspect.getsource(LoadScopeScheduling.schedule)
    assert "self._split_scope(nodeid)" in schedule and "self.config.option.loadscopereorder" in schedule, schedule
    assert "self._split_scope(nodeid)" in inspect.getsource(LoadScopeScheduling.mark_test_complete)


def test_work_units_are_modules_except_the_browser_and_the_tutorials() -> None:
    assert work_unit("tests/core/test_fabric.py::test_a[x::y]") == "tests/core/test_fabric.py"
    assert work_unit("tests/fake_habana/test_conformance.py::test_b") == "tests/fake_habana/test_conformance.py"
    assert work_unit("tests/browser/test_notebook_browser.py::test_c") == work_unit(
        "tests/browser/test_trace_viewer_browser.py::test_d") == "browser"
    assert work_unit("notebooks/02_mixed_precision.ipynb::02_mixed_precision.ipynb") == work_unit(
        "tests/notebook/test_tutorials.py::test_e") == "tutorials"
    root = Path(__file__).resolve().parents[1]
    assert all(unit in ("browser", "tutorials") or (root / unit).is_file() for unit in LONGEST_FIRST)  # none stale

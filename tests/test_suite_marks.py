"""The slow list (tests/suite_marks.py) names tests that exist: a renamed test would silently join `make test-fast`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.suite_marks import SLOW_TESTS, mark_slow, unparametrized

ROOT = Path(__file__).resolve().parents[1]


def _defined_tests(path: Path) -> set[str]:
    """The test functions of a module, as `name` and `Class::name`."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names |= {f"{node.name}::{f.name}" for f in node.body
                      if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef) and f.name.startswith("test")}
    return names


@pytest.mark.parametrize("name", sorted(SLOW_TESTS))
def test_every_slow_name_is_a_test(name: str) -> None:
    path, _, test = name.partition("::")
    assert (ROOT / path).is_file(), f"{name}: no file {path}"
    if test:  # else the whole file is slow
        assert test in _defined_tests(ROOT / path), f"{name}: {path} defines no such test (renamed? update suite_marks)"


def test_parameters_do_not_matter_and_only_listed_tests_are_marked() -> None:
    assert unparametrized("tests/test_a.py::test_b[1dev-x[y]]") == "tests/test_a.py::test_b"

    class Item:
        def __init__(self, nodeid: str) -> None:
            self.nodeid, self.marks = nodeid, []

        def add_marker(self, mark: pytest.MarkDecorator) -> None:
            self.marks.append(mark.name)

    listed = next(iter(SLOW_TESTS), None)
    if listed is None:
        pytest.skip("no test is listed")
    items = [Item(f"{listed}[p]"), Item(listed), Item("tests/test_nowhere.py::test_quick")]
    mark_slow(items)  # type: ignore[arg-type]
    assert [item.marks for item in items] == [["slow"], ["slow"], []]
    whole = next(name for name in SLOW_TESTS if "::" not in name)
    in_file = [Item(f"{whole}::test_any[x]"), Item(f"{whole}x::test_any")]
    mark_slow(in_file)  # type: ignore[arg-type]
    assert [item.marks for item in in_file] == [["slow"], []]

"""How `make test` shares the suite between its pytest-xdist workers: the units of work and their order.

- One unit per test module: its tests run on one worker, in order, so a module fixture (processes a module starts
  at once, a notebook executed once) runs once.
- One unit for the browser tests: one JupyterLab server and one Chromium at a time.
- One unit for the tutorials: nbmake's runs of notebooks/, then tests/notebook/test_tutorials.py, which reads what
those runs executed (tests/helpers/notebook_runs.py).

pytest-xdist's `--dist loadgroup` would do this from `xdist_group` marks, but it applies them by rewriting
`item._nodeid`, which pytest 9.2 no longer reads for `item.nodeid`: the marks were silently ignored and every test
was its own unit (module fixtures ran on both workers). So `tests/conftest.py` gives xdist a scheduler
(`pytest_xdist_make_scheduler`) that is xdist's own LoadScopeScheduling with our units, the way xdist's LoadFile
and LoadGroup schedulers are built; tests/test_suite_plugins_tripwire.py checks the method it relies on.

The units measured longest on this machine start first (a long unit started last keeps one worker busy while the
other has finished); the rest keep their collection order. A stale list only changes the order.
"""

from __future__ import annotations

from typing import Any

LONGEST_FIRST = (  # measured: fresh clone, 2 workers (seconds of the unit's tests)
    "browser",  # ~300 s
    "tests/notebook/test_config_widget.py",  # ~250 s: every generated Trainer configuration trains
    "tests/core/test_liveness_fabric_deepspeed.py",  # ~250 s: stuck and killed ranks, collective timeouts
    "tutorials",  # ~170 s: seven notebook kernels
    "tests/fake_habana/test_conformance.py",  # ~120 s: fresh interpreters on the fake Gaudi releases
    "tests/third_party/test_transformers_on_hpu.py",  # ~80 s alone: fresh interpreters importing transformers, 2 ranks
    "tests/core/test_parallel_liveness.py",  # ~110 s
    "tests/core/test_plugin_behaviours_deepspeed.py",  # ~100 s
    "tests/runtime/test_packaging.py",  # ~90 s: a wheel installed into a fresh venv
)


def work_unit(nodeid: str) -> str:
    path = nodeid.split("::")[0]
    if path.startswith("tests/browser/"):
        return "browser"
    if path.startswith("notebooks/") or path == "tests/notebook/test_tutorials.py":
        return "tutorials"
    return path


def start_order(nodeid: str) -> int:
    """Sort key for the collection: the longest units first, then the rest (a stable sort keeps their order)."""
    unit = work_unit(nodeid)
    return LONGEST_FIRST.index(unit) if unit in LONGEST_FIRST else len(LONGEST_FIRST)


def make_scheduler(config: Any, log: Any) -> Any:
    """xdist's scope scheduler, with `work_unit` as the scope of each test, in collection order (not xdist's
    default of the units with most tests first)."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False
    class WorkUnitScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return WorkUnitScheduling(config, log)

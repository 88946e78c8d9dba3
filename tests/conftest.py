"""Every test starts on a fresh emulated Gaudi2 with a clean environment."""

from __future__ import annotations

import os

import pytest

import hpu_nb.runtime as runtime
from hpu_nb.emulator import hpu_device
from hpu_nb.emulator.fp8 import inc_log
from tests.helpers import kernel_nudge
from tests.helpers.cpu_info_once import ask_cpu_info_once
from tests.helpers.notebook_runs import record_nbmake_runs
from tests.suite_marks import MeasuredSlow
from tests.work_units import make_scheduler, start_order

ask_cpu_info_once()

HPU_ENV = (
    "HPU_NB_BACKEND",
    "HPU_NB_DEVICE",
    "HPU_NB_MEMORY_LIMIT",
    "HPU_NB_DEVICE_COUNT",
    "PT_HPU_LAZY_MODE",
    "LOWER_LIST",
    "FP32_LIST",
    "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST",
    "PT_HPU_AUTOCAST_FP32_OPS_LIST",
    "HABANA_VISIBLE_MODULES",
    "HABANA_PROFILE",
    "QUANT_CONFIG",
    "HABANA_LOGS",
)


@pytest.fixture(autouse=True)
def fresh_backend(monkeypatch: pytest.MonkeyPatch):
    before = dict(os.environ)
    for name in HPU_ENV:
        monkeypatch.delenv(name, raising=False)
    # fp8 inference logs where INC does, ~/.habana_logs/inc_log.txt without HABANA_LOGS: off unless a test asks for it
    monkeypatch.setenv("LOG_LEVEL_INC", "6")
    inc_log.reset()
    runtime.reset_backend()
    _default_card()
    yield
    inc_log.reset()
    runtime.reset_backend()
    _restore_default_autocast_lists()
    monkeypatch.undo()  # the test's own setenv / delenv are not leaks
    _restore_environment(before)


def _default_card() -> None:
    """A card started earlier on this worker keeps the configuration it started with (the card in force, as in a
    user's process): a test that first used it under HPU_NB_DEVICE=gaudi would leave every later test a first-generation
    Gaudi. Put it back to the clean environment's card."""
    if hpu_device.is_loaded():
        hpu_device.configure(hpu_device.config_from_environment())


def _restore_environment(before: dict[str, str]) -> None:
    """Put os.environ back as the test found it. What the code under test sets in its own process by design (the
    op-list variables, DeepSpeed's DS_ACCELERATOR, Lightning's PL_GLOBAL_SEED, WORLD_SIZE / RANK from Habana's
    initialize_distributed_hpu) would otherwise reach the next test on the worker and every process that one starts:
    a tutorial's kernel, a rank, a fresh interpreter."""
    for key in set(before) | set(os.environ):
        if key == "PYTEST_CURRENT_TEST" or before.get(key) == os.environ.get(key):
            continue
        if key in before:
            os.environ[key] = before[key]
        else:
            del os.environ[key]


def _restore_default_autocast_lists() -> None:
    """Op lists are process-wide (as on a Gaudi): a test that loaded its own must not leave them to the next one."""
    import warnings

    if hpu_device.is_loaded():
        from hpu_nb.emulator.hpu_device import autocast

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            autocast.register(autocast.lists_from_environment({}))


@pytest.fixture
def fresh_compiler(monkeypatch: pytest.MonkeyPatch):
    """dynamo's caches empty, the emulated hpu_backend's counters at zero, its dynamic-shape switch as the environment
    says (for the tests of torch.compile's counters and dynamic-shape tools)."""
    import torch._dynamo

    from hpu_nb.emulator import graph_compiler
    from hpu_nb.runtime.env import DYNAMIC_SHAPES_ENV

    monkeypatch.delenv(DYNAMIC_SHAPES_ENV, raising=False)
    monkeypatch.setattr(graph_compiler, "_dynamic_shapes", None)
    monkeypatch.setattr(graph_compiler, "_applied", False)
    monkeypatch.setattr(graph_compiler, "COUNTERS", graph_compiler.CompileCounters())
    saved = torch._dynamo.config.automatic_dynamic_shapes
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    torch._dynamo.config.automatic_dynamic_shapes = saved


# The fake habana_frameworks (a Gaudi we don't have) and a fake hl-smi, for the Gaudi-path tests.
from tests.fake_habana.fixture import fake_gaudi, fake_hlsmi, make_fake_gaudi, no_gaudi  # noqa: E402, F401


def pytest_configure(config: pytest.Config) -> None:
    """The tests measured at more than ~5 s are slow too (tests/suite_marks.py): `make test-fast` leaves them out.
    Under --nbmake the tutorial tests read the notebooks nbmake executed (tests/helpers/notebook_runs.py). Notebook
    cells a loaded kernel never saw are nudged (tests/helpers/kernel_nudge.py)."""
    config.pluginmanager.register(MeasuredSlow(), "hpu_nb-measured-slow")
    if config.getoption("nbmake", default=False):
        record_nbmake_runs()
    kernel_nudge.install()  # a cell whose request a loaded kernel never saw (ipykernel#1554) is nudged, and said


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The cells a nudge started (tests/helpers/kernel_nudge.py): each was a notebook stall that would have failed."""
    for first_line, waited in kernel_nudge.NUDGES:
        terminalreporter.write_line(f"kernel nudged after {waited} s (ipykernel#1554), cell: {first_line[:80]!r}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest units of work first (tests/work_units.py), and under --nbmake the notebooks right before the
    tutorial tests that read them; a stable sort, so a module's tests keep their order."""
    items.sort(key=lambda item: (start_order(item.nodeid), not getattr(item, "nbmake", False)))


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`make test` / `make test-fast` (`-n 2 --dist loadgroup`): one unit of work per module, the browser tests, the
    tutorials (tests/work_units.py: xdist's own loadgroup ignores its marks under pytest 9.2)."""
    return make_scheduler(config, log) if config.getvalue("dist") == "loadgroup" else None

"""The suite's own pytest plumbing leans on three plugins' internals: tests/helpers/notebook_runs.py replaces nbmake's
`NotebookRun` to keep each notebook nbmake executed for the tutorial tests, tests/work_units.py subclasses
pytest-xdist's LoadScopeScheduling with its own `_split_scope`, and tests/helpers/kernel_nudge.py wraps nbclient's
`_async_poll_for_reply`. Tripwires on each, and the behaviour itself."""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import inspect
import queue
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient.client import NotebookClient
from nbmake import pytest_items
from nbmake.nb_result import NotebookResult
from xdist.scheduler import LoadScopeScheduling

from tests.helpers import kernel_nudge, notebook_runs
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


# -- nbclient: the nudge for a request a loaded kernel never saw (tests/helpers/kernel_nudge.py) -----------------------
def test_nbclient_still_waits_for_a_cells_reply_in_the_poll_method_the_nudge_wraps() -> None:
    """If an nbclient upgrade stops waiting for the execute reply in `_async_poll_for_reply(msg_id, cell, ...)` on the
    shell channel, or stops recording the cell's busy status, the nudge would wrap nothing: fail here."""
    wrapped = NotebookClient._async_poll_for_reply
    assert getattr(wrapped, "_nudges_kernel", False), "tests/conftest.py installs the nudge"
    original = wrapped.__wrapped__
    assert list(inspect.signature(original).parameters)[:3] == ["self", "msg_id", "cell"]
    assert "self.kc.shell_channel.get_msg(" in inspect.getsource(original)
    execute = inspect.getsource(NotebookClient.async_execute_cell)
    assert "self._async_poll_for_reply(" in execute and 'cell["metadata"]["execution"] = {}' in execute, execute
    assert '["iopub.status.busy"]' in inspect.getsource(NotebookClient.process_message)


class _Shell:
    def __init__(self) -> None:
        self.messages: asyncio.Queue[dict[str, object]] = asyncio.Queue()

    async def get_msg(self, timeout: float | None = None) -> dict[str, object]:
        try:
            return await asyncio.wait_for(self.messages.get(), timeout)
        except asyncio.TimeoutError:
            raise queue.Empty from None


class _KernelThatMissedTheRequest:
    """Its shell missed the execute request: it reads it (and answers) only once another message reaches the socket,
    as ipykernel#1554 describes; or, with `started`, it is running the cell and answers after `answer_after` s."""

    def __init__(self, msg_id: str, started: bool = False, answer_after: float = 0.0) -> None:
        self.shell_channel = _Shell()
        self.msg_id = msg_id
        self.kernel_info_requests = 0
        if started:
            asyncio.get_running_loop().call_later(answer_after, self._answer)

    def _answer(self) -> None:
        self.shell_channel.messages.put_nowait({"parent_header": {"msg_id": self.msg_id}, "content": {"status": "ok"},
                                                "header": {"date": datetime.datetime.now()}})

    def kernel_info(self) -> str:
        self.kernel_info_requests += 1
        self.shell_channel.messages.put_nowait({"parent_header": {"msg_id": "info"}, "content": {"status": "ok"}})
        self._answer()  # woken, it reads the execute request too
        return "info"


def _run_in_own_thread(coroutine: Any) -> Any:
    """asyncio.run on a thread of its own: nbclient, run earlier on this worker, may leave this thread's loop marked
    running (asyncio.run refuses to start there)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


async def _poll(client: NotebookClient, cell: nbformat.NotebookNode, msg_id: str) -> dict[str, object]:
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    done.set_result(None)
    alive: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    return await client._async_poll_for_reply(msg_id, cell, 30, done, alive)


def test_a_cell_the_kernel_never_saw_is_nudged_and_its_reply_arrives(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel_nudge, "NUDGE_S", 0.05)
    monkeypatch.setattr(kernel_nudge, "NUDGES", [])
    client = NotebookClient(nbformat.v4.new_notebook())
    cell = nbformat.v4.new_code_cell("trainer.fit(model)\nprint('done')")
    cell["metadata"]["execution"] = {}  # as async_execute_cell leaves it: the kernel has not said busy

    async def run() -> tuple[dict[str, object], int]:
        client.kc = _KernelThatMissedTheRequest("exec-1")
        reply = await _poll(client, cell, "exec-1")
        return reply, client.kc.kernel_info_requests

    reply, nudges = _run_in_own_thread(run())
    assert reply["parent_header"] == {"msg_id": "exec-1"} and nudges == 1
    assert [line for line, _ in kernel_nudge.NUDGES] == ["trainer.fit(model)"]
    assert "shell.execute_reply" in cell["metadata"]["execution"]


def test_a_running_cell_is_never_nudged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel_nudge, "NUDGE_S", 0.05)
    monkeypatch.setattr(kernel_nudge, "NUDGES", [])
    client = NotebookClient(nbformat.v4.new_notebook())
    cell = nbformat.v4.new_code_cell("time.sleep(0.3)")
    cell["metadata"]["execution"] = {"iopub.status.busy": "2026-11-28T00:00:00.000000Z"}

    async def run() -> tuple[dict[str, object], int]:
        client.kc = _KernelThatMissedTheRequest("exec-2", started=True, answer_after=0.3)
        reply = await _poll(client, cell, "exec-2")
        return reply, client.kc.kernel_info_requests

    reply, nudges = _run_in_own_thread(run())
    assert reply["parent_header"] == {"msg_id": "exec-2"} and nudges == 0 and kernel_nudge.NUDGES == []

"""Each tutorial runs once per test session: when `make test` runs nbmake (the headless run of notebooks/ CI asks for),
the executed notebook nbmake produced is kept here, and tests/notebook/test_tutorials.py reads its outputs instead of
starting a second kernel for the same notebook (seven kernels, about two minutes of CPU on this machine).

nbmake has no hook for its result, so its item's `NotebookRun` is replaced with a subclass that records what
`execute()` returned; tests/test_suite_plugins_tripwire.py reads nbmake's source and fails loudly if that changes.
Without nbmake (`pytest tests/notebook/test_tutorials.py`), or for a notebook nbmake saw fail, the tutorial tests
execute the notebook themselves, as before.
"""

from __future__ import annotations

from pathlib import Path

import nbformat

EXECUTED: dict[str, nbformat.NotebookNode] = {}  # notebook file stem -> the notebook as nbmake executed it


def record_nbmake_runs() -> None:
    """Make nbmake's items record each notebook they execute without error (called once, in pytest_configure)."""
    from nbmake import pytest_items  # only when nbmake runs
    from nbmake.nb_result import NotebookResult

    base = pytest_items.NotebookRun
    if getattr(base, "records_into", None) is EXECUTED:
        return

    class RecordingNotebookRun(base):  # type: ignore[misc, valid-type]
        records_into = EXECUTED

        def execute(self) -> NotebookResult:
            result = super().execute()
            if result.error is None:
                EXECUTED[Path(self.filename).stem] = result.nb
            return result

    pytest_items.NotebookRun = RecordingNotebookRun

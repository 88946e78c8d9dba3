"""runtime/files.py: the small-file writer every hpu_nb file others may read at once goes through."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from hpu_nb.runtime import files


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_a_write_replaces_the_whole_file_with_the_umasks_mode(tmp_path: Path) -> None:
    target = tmp_path / "maxabs_quant.json"
    target.write_text("old")
    previous = os.umask(0o027)
    try:
        files.write_file_atomically(target, '{"mode": "QUANTIZE"}')
        assert files.process_umask() == 0o027
    finally:
        os.umask(previous)
    assert target.read_text() == '{"mode": "QUANTIZE"}'
    assert stat.S_IMODE(target.stat().st_mode) == 0o640  # not mkstemp's 0600: teammates read it
    files.write_file_atomically(target, b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01" and _leftovers(tmp_path) == []


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "measure.npz"
    target.write_bytes(b"the good measurement")

    def full_disk(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        files.write_file_atomically(target, b"half")
    assert target.read_bytes() == b"the good measurement" and _leftovers(tmp_path) == []


def test_threads_writing_one_file_at_once_each_leave_a_whole_file(tmp_path: Path) -> None:
    """Temporaries named by mkstemp, not by the process id: two threads of one process never share one."""
    target = tmp_path / "shared.json"
    documents = [str(i) * 100_000 for i in range(8)]
    errors: list[BaseException] = []

    def write(document: str) -> None:
        try:
            for _ in range(20):
                files.write_file_atomically(target, document)
                assert target.read_text() in documents  # never half of one, never two mixed
        except BaseException as err:  # collected, asserted on below
            errors.append(err)

    threads = [threading.Thread(target=write, args=(d,)) for d in documents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and target.read_text() in documents and _leftovers(tmp_path) == []

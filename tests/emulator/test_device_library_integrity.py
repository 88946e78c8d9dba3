"""A damaged cached device library is detected, never loaded, and rebuilt (issue 28, item 3).

torch's autoload loads the emulated device's library at every `import torch`: a library cut short used to kill the
interpreter with SIGBUS (CPU-only programs of the environment too), and a garbage one gave a bare OSError.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpu_nb.emulator.hpu_device import build


@pytest.fixture
def cache_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private cache directory holding a copy of this torch's built library and its record."""
    built = build.build(quiet=True)
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path))
    shutil.copy2(built, tmp_path / built.name)
    shutil.copy2(build.record_path(built), build.record_path(tmp_path / built.name))
    return tmp_path / built.name


def _python(code: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, build.CACHE_ENV: str(cache.parent)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=240,
                          check=False)


def test_the_record_says_what_the_build_left(cache_copy: Path) -> None:
    assert build.library_is_intact(cache_copy, check_digest=True)
    size, digest = build.record_path(cache_copy).read_text().split()
    assert int(size) == cache_copy.stat().st_size and len(digest) == 64


def test_a_library_cut_short_is_not_loaded(cache_copy: Path) -> None:
    with open(cache_copy, "r+b") as library:
        library.truncate(cache_copy.stat().st_size // 3)
    assert not build.library_is_intact(cache_copy)
    assert build.library_path() == cache_copy


@pytest.mark.timeout(300)
def test_import_torch_survives_a_library_cut_short_and_first_use_rebuilds_it(cache_copy: Path) -> None:
    with open(cache_copy, "r+b") as library:
        library.truncate(cache_copy.stat().st_size // 3)
    plain = _python("import torch; print(torch.ones(2).sum().item())", cache_copy)
    assert plain.returncode == 0 and plain.stdout.strip() == "2.0", plain.stderr[-2000:]  # was: SIGBUS
    used = _python("import torch; print((torch.ones(2, device='hpu') * 3).sum().item())", cache_copy)
    assert used.returncode == 0 and used.stdout.strip().endswith("6.0"), used.stderr[-2000:]
    assert "is not as its build left it" in used.stderr and "building it again" in used.stderr
    assert build.library_is_intact(cache_copy, check_digest=True)


@pytest.mark.timeout(300)
def test_the_build_command_finds_a_garbage_library_of_the_right_size_and_rebuilds_it(cache_copy: Path) -> None:
    size = cache_copy.stat().st_size
    cache_copy.write_bytes(b"\0" * size)  # the record's size, not its bytes
    result = subprocess.run([sys.executable, "-m", "hpu_nb.emulator.hpu_device"], capture_output=True, text=True,
                            env={**os.environ, build.CACHE_ENV: str(cache_copy.parent)}, timeout=240, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "is not the library its build recorded" in result.stderr and "building it again" in result.stderr
    assert build.library_is_intact(cache_copy, check_digest=True) and build.load_in_child(cache_copy) == ""

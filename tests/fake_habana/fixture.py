"""pytest fixtures for the fake Gaudi.

Use from tests/conftest.py: `from tests.fake_habana.fixture import *  # noqa: F403`.

fake_gaudi       8 x GAUDI2 fake installed, HPU_NB_BACKEND=gaudi, backend reset before and after.
make_fake_gaudi  factory: make_fake_gaudi(device_count=2, device_name="GAUDI3", pyhlml=True, backend=None).
fake_hlsmi       a fake `hl-smi` first on PATH (mode "normal"; set .mode to missing/failing/hanging/garbage).
no_gaudi         habana_frameworks unimportable and HPU_NB_BACKEND unset: the machine has no Gaudi.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from . import FakeHabana, block_habana, install_fake_habana
from .hlsmi import FakeHlSmi, fake_hlsmi_on_path

__all__ = ["fake_gaudi", "make_fake_gaudi", "fake_hlsmi", "no_gaudi"]


@pytest.fixture
def make_fake_gaudi() -> Iterator[Callable[..., FakeHabana]]:
    with contextlib.ExitStack() as stack:
        installed: list[FakeHabana] = []

        def make(**options: Any) -> FakeHabana:
            if installed:
                raise RuntimeError("make_fake_gaudi installs one fake per test")
            installed.append(stack.enter_context(install_fake_habana(**options)))
            return installed[0]

        yield make


@pytest.fixture
def fake_gaudi(make_fake_gaudi: Callable[..., FakeHabana]) -> FakeHabana:
    return make_fake_gaudi()


@pytest.fixture
def fake_hlsmi(tmp_path: Any) -> Iterator[FakeHlSmi]:
    with fake_hlsmi_on_path(tmp_path / "hlsmi-bin") as tool:
        yield tool


@pytest.fixture
def no_gaudi(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from hpu_nb.runtime import reset_backend

    monkeypatch.delenv("HPU_NB_BACKEND", raising=False)
    with block_habana():
        reset_backend()
        yield
        reset_backend()

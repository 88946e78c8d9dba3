"""The cluster tests run only when asked for by their marker (`make test-cluster`: `-m cluster`), never in `make test`
or `make test-fast`, whose environment has neither Open MPI, SLURM nor Ray: they need .ci/install_cluster.sh and the
`cluster` extra (.venv-cluster)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _asked_for(config: pytest.Config) -> bool:
    return "cluster" in (config.getoption("markexpr", default="") or "").replace("not cluster", "")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _asked_for(config):
        return
    left_out = [item for item in items if HERE in Path(str(item.path)).parents]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        ids = {id(item) for item in left_out}
        items[:] = [item for item in items if id(item) not in ids]

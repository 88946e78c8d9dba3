"""A multi-card Trainer acquires cards only in its workers, one each: never in the launching process.

On a Gaudi a process acquires a card the first time it uses the device, and asking Habana for the device name counts
(Habana's bridge source). These runs use the fake Gaudi's machine log (every acquisition, with its process id) and a
tenant's HABANA_VISIBLE_MODULES=2,3: a launcher that acquired a card early would hold card 0 (another tenant's), and
the workers would not get 2 and 3.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.fake_habana import FakeHabana

ROOT = Path(__file__).resolve().parents[2]
TENANT = {"HABANA_VISIBLE_MODULES": "2,3"}


def _worker_acquisitions(fake: FakeHabana) -> list[dict]:
    return sorted(fake.acquisitions(), key=lambda a: a["card"])


@pytest.mark.timeout(240)
def test_script_launcher_acquires_one_card_per_worker_and_none_before_launching(make_fake_gaudi, tmp_path):
    from tests.core.test_parallel import rank_reports, run_fit

    fake = make_fake_gaudi(device_count=8, release="1.22.0")
    env = fake.subprocess_env()
    result = run_fit(tmp_path / "out", "--devices", "2", env={
        "PYTHONPATH": env["PYTHONPATH"] + os.pathsep + str(ROOT),
        "HPU_NB_FAKE_HABANA_CONFIG": env["HPU_NB_FAKE_HABANA_CONFIG"], "HPU_NB_BACKEND": "gaudi", **TENANT})
    assert result.returncode == 0, result.stderr[-3000:]
    reports = rank_reports(tmp_path / "out")
    acquired = _worker_acquisitions(fake)
    # rank 0 is the launching process itself: it acquires only once HCCL named its card, after rank 1 started
    assert [(a["card"], a["how"]) for a in acquired] == [(2, "by HLS_MODULE_ID=2"), (3, "by HLS_MODULE_ID=3")]
    assert sorted(a["pid"] for a in acquired) == sorted(r["pid"] for r in reports)
    assert {r["backend"] for r in reports} == {"gaudi"} and reports[0]["metrics"]["rank_sum"] == 3.0
    # importing Habana's HCCL set MASTER_PORT=12345 in the launcher; the strategy chose a free port instead
    assert {r["master_port"] for r in reports} != {"12345"} and len({r["master_port"] for r in reports}) == 1


NOTEBOOK_SETUP = f"""
import os, sys, json
sys.path.insert(0, {str(ROOT)!r})
import lightning as L, torch
import hpu_nb
from hpu_nb.runtime import get_backend
from tests.dist_scripts.fit import Model, data
"""

NOTEBOOK_FIT = """
trainer = L.Trainer(accelerator="hpu", devices=2, max_epochs=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
print(json.dumps({"before_fit_acquired": get_backend().device_acquired(),
                  "name": trainer.accelerator.get_device_name()}))
trainer.fit(Model(), data())
print(json.dumps({"kernel_pid": os.getpid(), "launcher": type(trainer.strategy.launcher).__name__,
                  "rank_sum": float(trainer.callback_metrics["rank_sum"]), "backend": get_backend().name,
                  "acquired_after_fit": get_backend().device_acquired()}))
"""


@pytest.mark.timeout(240)
def test_notebook_fork_acquires_one_card_per_worker_and_none_in_the_kernel(make_fake_gaudi, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    fake = make_fake_gaudi(device_count=8, release="1.22.0")
    env = fake.subprocess_env()
    for name in ("PYTHONPATH", "HPU_NB_FAKE_HABANA_CONFIG"):
        monkeypatch.setenv(name, env[name])
    assert os.environ["HPU_NB_BACKEND"] == "gaudi"  # set by the fake for the kernel to inherit (and restored after)
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", TENANT["HABANA_VISIBLE_MODULES"])
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in (NOTEBOOK_SETUP, NOTEBOOK_FIT)])
    nbclient.NotebookClient(nb, timeout=200, kernel_name="python3").execute()
    lines = [json.loads(line) for line in _stdout(nb.cells[1]).strip().splitlines() if line.startswith("{")]
    before, after = lines[0], lines[-1]
    assert before == {"before_fit_acquired": False, "name": "GAUDI2"}
    assert after["launcher"] == "HPUMultiProcessingLauncher" and after["rank_sum"] == 3.0
    assert after["backend"] == "gaudi" and after["acquired_after_fit"] is False
    acquired = _worker_acquisitions(fake)
    assert [(a["card"], a["how"]) for a in acquired] == [(2, "by HLS_MODULE_ID=2"), (3, "by HLS_MODULE_ID=3")]
    assert all(a["pid"] != after["kernel_pid"] and a["ppid"] == after["kernel_pid"] for a in acquired)


def _stdout(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stdout")

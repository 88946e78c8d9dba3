"""Multi-card training from inside a Jupyter kernel (fork launcher): results come back, a crashing rank fails fast, a
stuck rank ends the cell with its name and leaves no worker behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[2]

SETUP = f"""
import sys, time, json
sys.path.insert(0, {str(ROOT)!r})
import lightning as L, torch
import hpu_nb
from tests.dist_scripts.fit import Model, data
def trainer():
    return L.Trainer(accelerator="hpu", devices=2, max_epochs=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)
"""

FIT = """
L.seed_everything(7, verbose=False)
model = Model()
before = {k: v.clone() for k, v in model.state_dict().items()}
t = trainer()
t.fit(model, data())
print(json.dumps({"launcher": type(t.strategy.launcher).__name__,
                  "rank_sum": float(t.callback_metrics["rank_sum"]),
                  "weights_changed": any(not torch.equal(before[k], v) for k, v in model.state_dict().items()),
                  "global_step": t.global_step}))
"""

# Fails fast: the surviving rank must not wait out its collective timeout, set here far beyond the test's own timeout
# (a rank that waited would end the test by pytest-timeout, not by the crash's message).
CRASH = """
import os
os.environ["HPU_NB_COLLECTIVE_TIMEOUT"] = "900"
try:
    trainer().fit(Model(crash_rank=1, crash_step=1), data())
    outcome = "no error"
except Exception as err:
    outcome = f"{type(err).__name__}: {err}"
print(json.dumps({"outcome": outcome}))
"""


@pytest.mark.timeout(180)
def test_two_cards_from_a_notebook_kernel():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in (SETUP, FIT, CRASH)])
    nbclient.NotebookClient(nb, timeout=150, kernel_name="python3").execute()
    fit, crash = (json.loads(_stdout(nb.cells[i]).strip().splitlines()[-1]) for i in (1, 2))
    assert fit["launcher"] == "HPUMultiProcessingLauncher"  # forked workers, as Lightning requires in Jupyter
    assert fit["rank_sum"] == 3.0 and fit["weights_changed"]  # global_step stays in the workers, as with ddp_notebook
    assert "rank 1 exploded on purpose at step 1" in crash["outcome"]
    assert "timed out" not in crash["outcome"].lower() and "timeout" not in crash["outcome"].lower()


def _stdout(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stdout")


STUCK = """
import os, glob
os.environ["HPU_NB_COLLECTIVE_TIMEOUT"] = "20"
out = {out!r}
start = time.monotonic()
try:
    trainer().fit(Model(stuck_rank=1, stuck_step=1, out=out), data())
    outcome = "no error"
except Exception as err:
    outcome = f"{{type(err).__name__}}: {{err}}"
pids = {{os.path.basename(p): int(open(p).read()) for p in glob.glob(os.path.join(out, "*.pid"))}}
import psutil  # the process table, while this kernel still runs
def alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
deadline = time.monotonic() + 30
while (left := [p for p in pids.values() if alive(p)]) and time.monotonic() < deadline:
    time.sleep(0.5)
children = [c.pid for c in psutil.Process().children(recursive=True) if alive(c.pid)]
print(json.dumps({{"outcome": outcome, "pids": pids, "left": left, "children": children}}))
"""


@pytest.mark.timeout(400)  # a safety net: the collective timeout is 20 s
def test_a_stuck_rank_ends_the_cell_named_and_leaves_no_worker(tmp_path):
    sources = (SETUP, STUCK.format(out=str(tmp_path)))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in sources])
    nbclient.NotebookClient(nb, timeout=360, kernel_name="python3").execute()
    result = json.loads(_stdout(nb.cells[1]).strip().splitlines()[-1])
    stuck = result["pids"]["stuck1.pid"]
    assert "StuckRankError" in result["outcome"]
    assert f"Rank 1 (pid {stuck} on" in result["outcome"] and "did not answer" in result["outcome"]
    workers = [pid for name, pid in result["pids"].items() if name.startswith("rank")]
    assert len(workers) == 2 and stuck in workers
    assert result["left"] == [] and result["children"] == []  # checked inside the kernel, before it shut down

"""Tutorial 05's TensorBoard cell (issue 39, item 6): in `make lab`'s environment it opens TensorBoard inside the
notebook, whose PyTorch profiler plugin lists HPUProfiler's runs; the tutorial's last cell stops it again."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("tensorboard")
pytest.importorskip("torch_tb_profiler")

ROOT = Path(__file__).resolve().parents[2]

ASK_TENSORBOARD = """
import json, time, urllib.request
from tensorboard import manager
for _ in range(90):  # TensorBoard writes its info file once it serves: later than the magic returns on a busy machine
    mine = [info for info in manager.get_all() if info.logdir == str(LOGS)]
    if mine:
        break
    time.sleep(1)
runs = None
for _ in range(60):  # the plugin reads the traces in the background
    body = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{mine[0].port}/data/plugin/pytorch_profiler/runs",
                                             timeout=20).read())
    if not body["loading"]:
        runs = body["runs"]
        break
    time.sleep(2)
print(json.dumps({"instances": len(mine), "runs": runs}))
"""

ASK_STOPPED = """
time.sleep(2)
print(json.dumps({"left": [info.pid for info in manager.get_all() if info.logdir == str(LOGS)]}))
"""


@pytest.mark.timeout(600)
def test_the_tutorials_tensorboard_cell_shows_the_hpu_profiler_runs_and_the_last_cell_stops_it(tmp_path):
    nb = nbformat.read(ROOT / "notebooks" / "05_profiling.ipynb", as_version=4)
    opened = next(i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
                  and "%tensorboard --logdir" in cell.source)
    nb.cells.insert(opened + 1, nbformat.v4.new_code_cell(ASK_TENSORBOARD))
    nb.cells.append(nbformat.v4.new_code_cell(ASK_STOPPED))
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    html = "".join(o.get("data", {}).get("text/html", "") for o in nb.cells[opened].outputs)
    assert "<iframe" in html and "tensorboard-frame" in html  # TensorBoard inside the notebook
    import json

    asked = json.loads(nb.cells[opened + 1].outputs[-1]["text"].strip().splitlines()[-1])
    assert asked == {"instances": 1, "runs": ["bf16", "fp32"]}  # the profiler plugin reads HPUProfiler's traces
    stopped = json.loads(nb.cells[-1].outputs[-1]["text"].strip().splitlines()[-1])
    assert stopped == {"left": []}

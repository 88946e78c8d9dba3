"""Two cards from a notebook kernel (fork launcher): every multi-card strategy hands the trained weights back to the
notebook's model, equal to the same training done by plain torch in one process."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[2]

SETUP = f"""
import sys, json
sys.path.insert(0, {str(ROOT)!r})
import lightning as L, torch
import hpu_nb
from tests.dist_scripts.fit import Model, data, make_strategy
from hpu_nb.core.strategies.fsdp import HPUFSDPStrategy

def fit(strategy):
    L.seed_everything(7, verbose=False)
    model = Model()
    trainer = L.Trainer(accelerator="hpu", devices=2, max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, strategy=strategy)
    trainer.fit(model, data())
    print(json.dumps({{"launcher": type(trainer.strategy.launcher).__name__,
                      "weights": {{k: v.tolist() for k, v in model.state_dict().items()}},
                      "epoch": trainer.current_epoch, "global_step": trainer.global_step,
                      "batches": trainer.fit_loop.epoch_loop.batch_progress.total.completed,
                      "restarting": trainer.fit_loop.restarting, "finished": trainer.state.finished,
                      "logged": {{k: float(v) for k, v in trainer.logged_metrics.items()}},
                      "callback": {{k: float(v) for k, v in trainer.callback_metrics.items()}},
                      "bar": {{k: float(v) for k, v in trainer.progress_bar_metrics.items()}}}}))
"""

# Each as a user writes it in a cell: FSDP by name (the config widget's code names it too) and with sharded
# checkpoints + CPU offload, DDP, DeepSpeed ZeRO-3 with the optimizer offloaded.
CELLS = {
    "hpu_fsdp": 'fit("hpu_fsdp")',
    "fsdp sharded offload": 'fit(HPUFSDPStrategy(state_dict_type="sharded", cpu_offload=True))',
    "hpu_ddp": 'fit("hpu_ddp")',
    "deepspeed zero-3 offload": 'fit(make_strategy("ds:3:offload"))',
    # Lightning's own names, as its advice in a notebook gives them: hpu_nb's HPU strategies with their arguments
    "ddp": 'fit("ddp")',
    "ddp_notebook": 'fit("ddp_notebook")',
    "deepspeed": 'fit("deepspeed")',
}


def reference_weights() -> dict[str, torch.Tensor]:
    """The same training in one process with plain torch. Each rank draws its batches of 8 through a DistributedSampler
    shuffled with the global seed (7), as the workers do; step k's averaged gradient is the gradient over both ranks'
    k-th batches together."""
    import lightning as L
    from torch.utils.data import DistributedSampler

    from tests.dist_scripts.fit import Model, data

    L.seed_everything(7, verbose=False)
    model = Model()
    dataset = data().dataset
    ranks = [list(DistributedSampler(dataset, num_replicas=2, rank=r, shuffle=True, seed=7)) for r in (0, 1)]
    optimizer = torch.optim.SGD(model.parameters(), lr=model.lr)
    for start in range(0, len(ranks[0]), 8):
        x, y = dataset[ranks[0][start : start + 8] + ranks[1][start : start + 8]]
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return model.state_dict()


@pytest.mark.timeout(600)
def test_every_strategy_hands_the_trained_weights_and_progress_to_the_notebook(monkeypatch):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")  # the kernel's environment: FSDP runs in eager mode only
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in (SETUP, *CELLS.values())])
    nbclient.NotebookClient(nb, timeout=240, kernel_name="python3").execute()
    expected = reference_weights()
    initial = _initial_weights()
    for cell, name in zip(nb.cells[1:], CELLS, strict=True):
        result = json.loads(_stdout(cell).strip().splitlines()[-1])
        forked = ("_FSDPMultiProcessingLauncher" if "fsdp" in name else
                  "_DeepSpeedMultiProcessingLauncher" if "deepspeed" in name else "HPUMultiProcessingLauncher")
        assert result["launcher"] == forked, name  # forked workers, as Lightning requires in Jupyter
        got = {k: torch.tensor(v) for k, v in result["weights"].items()}
        assert got.keys() == expected.keys(), name
        for key, want in expected.items():
            assert got[key].shape == want.shape, (name, key)
            assert not torch.equal(got[key], initial[key]), (name, key)  # trained, not the notebook's initial model
            error = float((got[key] - want).abs().max())
            assert torch.allclose(got[key], want, rtol=1e-5, atol=1e-6), (name, key, error)
        # the loops' progress, as a one-card fit shows it (Lightning's launcher leaves 0 here): 1 epoch of 32 samples
        # per rank in batches of 8, and the metrics logged in the workers' last step (rank_sum: 1 + 2, summed)
        assert (result["epoch"], result["global_step"], result["batches"]) == (1, 4, 4), (name, result["epoch"])
        assert result["finished"] and not result["restarting"], name
        assert set(result["logged"]) >= {"train_loss", "rank_sum"}, name
        assert result["logged"]["rank_sum"] == 3.0, name
        assert result["logged"]["train_loss"] == result["callback"]["train_loss"], name


def _initial_weights() -> dict[str, torch.Tensor]:
    import lightning as L

    from tests.dist_scripts.fit import Model

    L.seed_everything(7, verbose=False)
    return Model().state_dict()


def _stdout(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stdout")


# -- MemoryMonitor on 2 cards: rank 0 of the forked workers streams to the kernel's chart ------------------------------
MONITOR = """
import threading
from hpu_nb.notebook.memory_monitor import MemoryMonitor, unpack_points
monitor = MemoryMonitor(update_interval=0)
during_fit = []  # the chart's updates and the thread that made them
monitor.chart.observe(lambda change: during_fit.append((threading.current_thread().name, change["name"])),
                      names=["delta", "ranks"])
L.seed_everything(7, verbose=False)
trainer = L.Trainer(accelerator="hpu", devices=2, max_epochs=2, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
                    strategy=make_strategy("{strategy}", start_method="fork"), callbacks=[monitor])
trainer.fit(Model(), data())
print(json.dumps({{"status": monitor.status, "chart_status": monitor.chart.status, "samples": monitor.samples,
                  "points": [p[:4] for p in monitor.history.points], "ranks": monitor.rank_history,
                  "during_fit": during_fit, "stage": monitor.chart.stage, "summary": monitor.chart.summary}}))
"""


@pytest.mark.timeout(400)
@pytest.mark.parametrize("strategy", ["auto", "ds:3:offload"])
def test_memory_monitor_on_two_cards_draws_every_rank_live(strategy):
    sources = (SETUP, MONITOR.format(strategy=strategy))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in sources])
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    cell = nb.cells[1]
    result = json.loads(_stdout(cell).strip().splitlines()[-1])
    assert result["status"] == result["chart_status"] == "done" and result["stage"] == "fit"
    # the starting point and 2 epochs x 4 batches, sampled by the workers' rank 0, numbered as a script's rank 0 does
    assert [p[0] for p in result["points"]] == list(range(1, 10))
    batches = result["points"][1:]  # the starting point comes before the model is on the card
    assert all(p[2] > 0 and p[3] >= p[2] for p in batches), result["points"]  # InUse <= MaxInUse
    ranks = result["ranks"]
    assert ranks["x"] == list(range(2, 10))  # gathered at every training step (log_every_n_steps=1)
    assert all(len(row) == 2 and min(row) > 0 for row in ranks["in_use"]), ranks  # both ranks' memory
    # drawn while the workers ran: by the thread that follows them (it ends before fit returns), points and ranks
    relayed = [trait for thread, trait in result["during_fit"] if thread == "MemoryMonitor relay"]
    assert set(relayed) == {"delta", "ranks"} and relayed.count("ranks") == 8
    assert "9 batches sampled (done)" in result["summary"] and "rank 1" in result["summary"]
    kinds = [o.get("data", {}) for o in cell.outputs if o["output_type"] == "display_data"]
    assert any("application/vnd.jupyter.widget-view+json" in d for d in kinds)  # the live chart, in the fit's cell
    stderr = "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stderr")
    assert "all_gather is deprecated" not in stderr


# -- Fabric: what the function returns comes back to the notebook, tensors included ---------------------------------
FABRIC = """
import torch, lightning as L
from hpu_nb.core.fabric.strategies import HPUParallelStrategy

def train(fabric, model):
    fabric.seed_everything(3)
    model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for _ in range(3):
        x = torch.randn(16, 8, device=fabric.device) + fabric.global_rank
        fabric.backward(model(x).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()
    return {"state": model.state_dict(), "rank": fabric.global_rank}

torch.manual_seed(0)
fabric = L.Fabric(accelerator="hpu", devices=2, strategy=HPUParallelStrategy(start_method="fork"))
result = fabric.launch(train, torch.nn.Linear(8, 1))
print(json.dumps({"launcher": type(fabric.strategy.launcher).__name__, "rank": result["rank"],
                  "types": sorted({type(v).__name__ for v in result["state"].values()}),
                  "state": {k: v.tolist() for k, v in result["state"].items()}}))
"""


def fabric_reference() -> dict[str, torch.Tensor]:
    """Plain torch: both ranks draw the same batch (same seed), rank r adds r; DDP averages their gradients."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(3)
    for _ in range(3):
        x = torch.randn(16, 8)
        loss = sum(model(x + rank).pow(2).mean() for rank in (0, 1)) / 2
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.state_dict()


@pytest.mark.timeout(300)
def test_fabric_returns_tensors_to_the_notebook():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in (SETUP, FABRIC)])
    nbclient.NotebookClient(nb, timeout=200, kernel_name="python3").execute()
    result = json.loads(_stdout(nb.cells[1]).strip().splitlines()[-1])
    assert result["launcher"] == "_FabricMultiProcessingLauncher" and result["rank"] == 0
    assert result["types"] == ["Tensor"]
    for key, want in fabric_reference().items():
        got = torch.tensor(result["state"][key])
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), (key, float((got - want).abs().max()))


# -- Lightning's progress bar on 2 cards: one bar, in its widget, ending at the last step ----------------------------
MONITOR_WITH_BAR = """
import time
from hpu_nb.notebook.memory_monitor import MemoryMonitor

class SlowModel(Model):
    def training_step(self, batch, batch_idx):
        time.sleep(0.05)
        return super().training_step(batch, batch_idx)

monitor = MemoryMonitor(update_interval=0)
L.seed_everything(7, verbose=False)
trainer = L.Trainer(accelerator="hpu", devices=2, max_epochs=1, log_every_n_steps=1, logger=False,
                    enable_checkpointing=False, enable_model_summary=False, callbacks=[monitor])
trainer.fit(SlowModel(), data(n=480))
"""
BAR = re.compile(r"Epoch 0/0\s.*?(\d+)/(\d+)", re.S)


@pytest.mark.timeout(300)
def test_two_card_monitor_cell_shows_one_progress_bar_ending_at_the_last_step():
    """Issue 20: the cell showed the finished bar and a second one frozen at 17/30. The forked rank 0 draws Lightning's
    (rich) bar in an ipywidgets.Output, setting and clearing its msg_id around each frame; a frame that reached the
    front end after the clear (ipykernel sent each message of a forked child on a new socket, so out of order) landed
    in the cell. The cell's outputs: one Output widget holding the bar, its last frame at 30/30, no bar outside it."""
    _assert_one_bar_ending_at_the_last_step(MONITOR_WITH_BAR)


# The same bar without a monitor: the fork launcher itself keeps each worker's output in order (every forked fit).
PLAIN_WITH_BAR = """
import os, sys, time

class SlowModel(Model):
    def setup(self, stage):  # in the forked rank 0, before the bar starts: the launcher made its output ordered
        if self.global_rank == 0:
            print(f"ordered={getattr(sys.stdout.pub_thread, '_hpu_nb_ordered_pid', None) == os.getpid()}")

    def training_step(self, batch, batch_idx):
        time.sleep(0.05)
        return super().training_step(batch, batch_idx)

L.seed_everything(7, verbose=False)
trainer = L.Trainer(accelerator="hpu", devices=2, max_epochs=1, log_every_n_steps=1, logger=False,
                    enable_checkpointing=False, enable_model_summary=False, strategy="hpu_ddp")
trainer.fit(SlowModel(), data(n=480))
"""


@pytest.mark.timeout(300)
def test_two_card_ddp_cell_shows_one_progress_bar_ending_at_the_last_step():
    """Issue 20 without a MemoryMonitor: a plain 2-card DDP fit with Lightning's default bar shows one bar, in its
    widget, at 30/30."""
    cell = _assert_one_bar_ending_at_the_last_step(PLAIN_WITH_BAR)
    assert "ordered=True" in _stdout(cell), _stdout(cell)[-300:]


def _assert_one_bar_ending_at_the_last_step(cell: str) -> Any:
    """Runs `cell` after SETUP; returns the executed cell."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in (SETUP, cell)])
    nbclient.NotebookClient(nb, timeout=240, kernel_name="python3", store_widget_state=True).execute()
    outputs = nb.cells[1].outputs
    outside = [o for o in outputs if BAR.search(json.dumps(o.get("data", {})) + o.get("text", ""))]
    assert outside == [], outside  # no frame of the bar outside its widget
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    shown = {o["data"]["application/vnd.jupyter.widget-view+json"]["model_id"] for o in outputs
             if "application/vnd.jupyter.widget-view+json" in o.get("data", {})}
    bars = [state[m]["state"]["outputs"] for m in shown if state[m]["model_name"] == "OutputModel"]
    assert len(bars) == 1, bars  # one progress bar (another widget shown is the monitor's chart)
    frames = [BAR.search(o["data"]["text/plain"]) for o in bars[0]]
    assert len(frames) == 1 and frames[0] is not None, bars[0]  # each frame replaced the previous one
    assert frames[0].groups() == ("30", "30")  # 480 samples / (2 ranks x batch 8): the bar ends at the last step
    return nb.cells[1]


ORDERED_WORKERS = f"""
import multiprocessing, sys, time
sys.path.insert(0, {str(ROOT)!r})
from hpu_nb.core.strategy_parts.worker_output import keep_worker_output_in_order, wait_for_worker_output

def work(rank):
    ordered = keep_worker_output_in_order()
    for i in range(300):  # one write a line: the two workers' lines interleave, never their halves
        sys.stdout.write(f"{{rank}}:{{i}}\\n")
        sys.stdout.flush()
    sys.stdout.write(f"{{rank}}:ordered={{ordered}}\\n")
    sys.stdout.flush()

workers = [multiprocessing.get_context("fork").Process(target=work, args=(rank,)) for rank in (0, 1)]
for worker in workers:
    worker.start()
for worker in workers:
    worker.join()
print(f"drained={{wait_for_worker_output()}}")  # the cell ends now: their output must be published before
"""


@pytest.mark.timeout(120)
def test_forked_workers_output_reaches_the_notebook_complete_and_in_order():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(ORDERED_WORKERS)])
    nbclient.NotebookClient(nb, timeout=60, kernel_name="python3").execute()
    text = _stdout(nb.cells[0])
    assert text.rstrip().endswith("drained=True"), text[-200:]
    lines = [line.split(":") for line in text.splitlines()[:-1]]
    for rank in ("0", "1"):
        mine = [value for r, value in lines if r == rank]
        assert mine == [str(i) for i in range(300)] + ["ordered=True"], mine[-5:]


# -- Fabric's forked workers print: each rank's lines reach the cell complete, in order, before what follows the launch
FABRIC_PRINTS = """
import os, sys

def count(fabric):
    ordered = getattr(sys.stdout.pub_thread, "_hpu_nb_ordered_pid", None) == os.getpid()  # the launcher's doing
    sys.stdout.write(f"ordered{fabric.global_rank}:{ordered}\\n")  # one write a line, as below
    sys.stdout.flush()
    for i in range(200):  # one write a line: the two ranks' lines interleave, never their halves
        sys.stdout.write(f"{fabric.global_rank}:{i}\\n")
        sys.stdout.flush()

fabric = L.Fabric(accelerator="hpu", devices=2, strategy=HPUParallelStrategy(start_method="fork"))
fabric.launch(count)
print("after:launch")
"""


@pytest.mark.timeout(300)
def test_fabric_workers_prints_reach_the_notebook_complete_and_in_order():
    source = "from hpu_nb.core.fabric.strategies import HPUParallelStrategy\n" + FABRIC_PRINTS
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in (SETUP, source)])
    nbclient.NotebookClient(nb, timeout=200, kernel_name="python3").execute()
    lines = [line.split(":") for line in _stdout(nb.cells[1]).splitlines() if re.fullmatch(r"\w+:\w+", line)]
    assert lines[-1] == ["after", "launch"], lines[-3:]  # the workers' last lines were published before it
    assert ["ordered0", "True"] in lines and ["ordered1", "True"] in lines, lines[:4]  # each worker's output: one pipe
    for rank in ("0", "1"):
        assert [value for r, value in lines if r == rank] == [str(i) for i in range(200)], rank


# -- Interrupting a 2-card fit: one line, the weights of the step it stopped at, a kernel that trains again ---------
INTERRUPTIBLE = """
import hashlib, pathlib, time

def checksum(module):
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().float().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]

class StepLog(L.Callback):
    \"\"\"In the workers' rank 0: the checksum of the weights after each step, in steps.json.\"\"\"
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_rank == 0:
            path = pathlib.Path("steps.json")
            steps = json.loads(path.read_text()) if path.exists() else {}
            steps[str(trainer.global_step)] = checksum(module)
            path.write_text(json.dumps(steps))
            print(f"STEP {trainer.global_step}", flush=True)

class SlowModel(Model):
    def training_step(self, batch, batch_idx):
        time.sleep(0.1)
        return super().training_step(batch, batch_idx)

def two_card_fit(epochs, n):
    pathlib.Path("steps.json").unlink(missing_ok=True)
    L.seed_everything(7, verbose=False)
    global model
    model = SlowModel()
    trainer = L.Trainer(accelerator="hpu", devices=2, max_epochs=epochs, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, strategy="hpu_ddp",
                        callbacks=[StepLog()])
    trainer.fit(model, data(n=n))
"""
INTERRUPTED_AT = 3  # the interrupt is sent once the workers printed this step


@pytest.mark.timeout(400)
def test_interrupting_a_two_card_fit_leaves_one_line_the_weights_of_its_step_and_a_kernel_that_trains(tmp_path):
    """Issue 31, item 4: the kernel interrupted (SIGINT to its process group, as Jupyter does) during a forked 2-card
    fit. The cell ends with one line naming the step the workers stopped at, and no SIGTERM / SystemExit / "To exit"
    lines; the notebook's model holds the weights rank 0 had after that step; the kernel stays busy until the cell
    ends; the next cell's fit trains."""
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(tmp_path))
    client = km.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=120)
        setup = _run(client, SETUP + INTERRUPTIBLE)
        assert setup["status"] == "ok", setup
        interrupted = _run(client, "two_card_fit(epochs=20, n=960)", interrupt=(km, f"STEP {INTERRUPTED_AT}"))
        assert interrupted["status"] == "error" and interrupted["ename"] == "FitInterrupted", interrupted
        [line] = interrupted["traceback"]  # the one line, in place of a traceback
        match = re.fullmatch(r"Stopped by you after (\d+) steps: the model you passed to fit\(\) has the weights of"
                             r" step (\d+)\.", line)
        assert match and match[1] == match[2], line
        step = int(match[1])
        assert INTERRUPTED_AT < step < 20 * 60, step  # stopped where it was, long before the 20 epochs' end
        streams = interrupted["stdout"] + interrupted["stderr"]
        for noise in ("SIGTERM", "SystemExit", "To exit", "Traceback", "KeyboardInterrupt", "Detected"):
            assert noise not in streams, (noise, streams[-800:])
        # busy from the request until its end, once: no idle while the workers stopped
        assert [s for s in interrupted["states"] if s != "busy"] == ["idle"], interrupted["states"]

        weights = _run(client, "print(json.dumps({'notebook': checksum(model),"
                               " 'steps': json.loads(pathlib.Path('steps.json').read_text())}))")
        result = json.loads(weights["stdout"].strip().splitlines()[-1])
        assert max(map(int, result["steps"])) == step  # the workers stopped right after the step the line names
        assert result["notebook"] == result["steps"][str(step)]  # and the notebook's model has that step's weights

        again = _run(client, "two_card_fit(epochs=1, n=64); print('steps', len(json.loads("
                             "pathlib.Path('steps.json').read_text())), checksum(model))")
        assert again["status"] == "ok", again
        assert again["stdout"].strip().splitlines()[-1].startswith("steps 4 "), again["stdout"][-300:]
    finally:
        client.stop_channels()
        km.shutdown_kernel(now=True)


def _run(client: Any, code: str, interrupt: tuple[Any, str] | None = None, timeout: float = 240) -> dict[str, Any]:
    """Execute `code`; with `interrupt` (kernel manager, text), interrupt the kernel once that text is printed. Returns
    the reply's status, the error's name and traceback, the streams' text and the kernel's states (any request's)
    from the request to its end."""
    import queue
    import time

    msg_id = client.execute(code)
    got: dict[str, Any] = {"stdout": "", "stderr": "", "states": [], "ename": None, "traceback": []}
    sent = False
    deadline = time.monotonic() + timeout
    while True:
        try:
            msg = client.get_iopub_msg(timeout=max(1.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no end of the cell within {timeout} s: {got}") from None
        kind, content = msg["msg_type"], msg["content"]
        ours = msg["parent_header"].get("msg_id") == msg_id
        if kind == "status":
            got["states"].append(content["execution_state"] if ours else f"{content['execution_state']} (other)")
            if ours and content["execution_state"] == "idle":
                break
        elif ours and kind == "stream":
            got[content["name"]] += content["text"]
            if interrupt is not None and not sent and interrupt[1] in got["stdout"]:
                interrupt[0].interrupt_kernel()
                sent = True
        elif ours and kind == "error":
            got["ename"], got["traceback"] = content["ename"], content["traceback"]
    got["status"] = client.get_shell_msg(timeout=30)["content"]["status"]
    return got

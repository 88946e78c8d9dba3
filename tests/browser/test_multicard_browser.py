"""Issue 20 in a real JupyterLab + Chromium, on 2 emulated cards from one notebook (one kernel, one page):

- FSDP, DDP, DeepSpeed ZeRO-3 + optimizer offload, Lightning's own "ddp_notebook" and Fabric train in forked workers,
  and the trained weights come back into the notebook's model: its checksum differs from the initial one and equals
  the one rank 0 of the workers wrote (computed there from the whole weights, gathered from both ranks); the Trainer's
  current_epoch / global_step and logged metrics come back too (issue 39);
- none of those fits shows a stderr output (red) other than Lightning's own lines and hpu_nb's one line;
- MemoryMonitor on 2 cards draws both ranks' memory live (the rank0 / rank1 paths of the chart's SVG gain points while
  the cell runs), each rank in a style of its own with its own legend entry, and its summary names both ranks after
  fit; the cell shows one progress bar, ending at the last step;
- interrupting a 2-card fit from JupyterLab leaves one line naming the step whose weights the model holds, the status
  bar busy until then, and a kernel that trains again (its own notebook and kernel, the `lab` fixture's).

The tests share one page and one kernel (module fixture `page`): the browser and the kernel start once. Run alone they
run the cells they read. Screenshots go to the artifacts folder (docs/screenshots/ with HPU_NB_UPDATE_SCREENSHOTS=1).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import JupyterLab, LabPage
from tests.core.test_output_noise import EXPECTED

pytestmark = [pytest.mark.timeout(900)]

NOTEBOOK = "multicard.ipynb"

SETUP = '''%load_ext hpu_nb
import hashlib, pathlib, time
import lightning as L, torch, hpu_nb
from tests.dist_scripts.fit import Model, data
from hpu_nb.core.strategies.deepspeed import HPUDeepSpeedStrategy
from hpu_nb.core.strategies.fsdp import HPUFSDPStrategy

def checksum(named):
    """sha256 of the weights (name and float32 bytes of each tensor), first 16 hex digits."""
    digest = hashlib.sha256()
    for name, tensor in sorted(named, key=lambda item: item[0]):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().float().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]

class ReportWeights(L.Callback):
    """In the workers, after training: rank 0 writes the checksum of the whole weights, gathered from every rank."""
    def __init__(self, name):
        self.path = pathlib.Path(f"workers_{name}.txt")
    def on_train_end(self, trainer, module):
        strategy = trainer.strategy
        if isinstance(strategy, HPUFSDPStrategy):  # every rank joins the full state dict's gather
            named = list(strategy.full_state_dict().items())
        elif getattr(strategy, "zero_stage_3", False):  # ZeRO-3 partitions the parameters: gather them
            import deepspeed
            params = dict(module.named_parameters())
            with deepspeed.zero.GatheredParameters(list(params.values())):
                named = [(k, v.detach().clone()) for k, v in params.items()]
        else:
            named = list(module.state_dict().items())
        if trainer.global_rank == 0:
            self.path.write_text(checksum(named))

def fit(name, strategy, model_class=Model):
    L.seed_everything(7, verbose=False)
    model = model_class()
    initial = checksum(model.state_dict().items())
    report = ReportWeights(name)
    report.path.unlink(missing_ok=True)
    trainer = L.Trainer(accelerator="hpu", devices=2, max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_model_summary=False, strategy=strategy, callbacks=[report])
    trainer.fit(model, data())
    print(f"WEIGHTS {name} initial={initial} notebook={checksum(model.state_dict().items())}"
          f" workers={report.path.read_text()}")
    print(f"PROGRESS {name} epoch={trainer.current_epoch} step={trainer.global_step}"
          f" logged={sorted(trainer.logged_metrics)}")'''

# one cell per strategy, as a user writes them. ZeRO-3 offloads the model's own SGD (DeepSpeed refuses a client
# optimizer with offload unless told, as here): DeepSpeedCPUAdam is a C++ op whose build can take minutes on a loaded
# machine, and the config widget's browser test already trains with it.
ZERO3_OFFLOAD = '''zero3 = HPUDeepSpeedStrategy(stage=3, offload_optimizer=True)
zero3.config["zero_force_ds_cpu_optimizer"] = False
fit("zero3_offload", zero3)'''

STRATEGIES = {
    "fsdp": 'fit("fsdp", "hpu_fsdp")',
    "ddp": 'fit("ddp", "hpu_ddp")',
    "zero3_offload": ZERO3_OFFLOAD,
    # issue 39: Lightning's advice in a notebook ("ddp_notebook") is hpu_nb's HPU DDP, and trains
    "ddp_notebook": 'fit("ddp_notebook", "ddp_notebook")',
}

FABRIC = '''from hpu_nb.core.fabric.strategies import HPUParallelStrategy

def train(fabric, net):
    fabric.seed_everything(3)
    net, optimizer = fabric.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    for _ in range(3):
        fabric.backward(net(torch.randn(16, 8, device=fabric.device) + fabric.global_rank).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()
    state = net.state_dict()
    if fabric.global_rank == 0:
        pathlib.Path("workers_fabric.txt").write_text(checksum(state.items()))
    return state

torch.manual_seed(0)
net = torch.nn.Linear(8, 1)
initial = checksum(net.state_dict().items())
pathlib.Path("workers_fabric.txt").unlink(missing_ok=True)
fabric = L.Fabric(accelerator="hpu", devices=2, strategy=HPUParallelStrategy(start_method="fork"))
net.load_state_dict(fabric.launch(train, net))
print(f"WEIGHTS fabric initial={initial} notebook={checksum(net.state_dict().items())}"
      f" workers={pathlib.Path('workers_fabric.txt').read_text()}")'''

# each training step sleeps, so the chart moves for a few seconds on any machine
MONITOR = '''class SlowModel(Model):
    def training_step(self, batch, batch_idx):
        time.sleep(0.15)
        return super().training_step(batch, batch_idx)

monitor = hpu_nb.MemoryMonitor(update_interval=0)
L.seed_everything(7, verbose=False)
trainer = L.Trainer(accelerator="hpu", devices=2, max_epochs=1, log_every_n_steps=1, logger=False,
                    enable_checkpointing=False, enable_model_summary=False, callbacks=[monitor])
trainer.fit(SlowModel(), data(n=480))'''

CELLS = [SETUP, *STRATEGIES.values(), FABRIC, MONITOR, "print('end')"]
STRATEGY_CELLS = {name: 1 + i for i, name in enumerate([*STRATEGIES, "fabric"])}
MONITOR_CELL = len(CELLS) - 2

STDERR = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
# Lightning's and hpu_nb's lines of a fit (tests/core/test_output_noise.py), and Lightning's line for the user's own
# fabric.seed_everything(3) in each worker
EXPECTED_STDERR = (*EXPECTED, r"\[rank: \d\] Seed set to 3")


class MulticardPage:
    """The shared page: the notebook open, its setup cell run once; `ensure(i)` runs cell i unless it already ran."""

    def __init__(self, lab: LabPage) -> None:
        self.lab = lab
        self.done: set[int] = set()
        self.seconds: dict[int, float] = {}

    def ensure(self, index: int, timeout: float = 240) -> None:
        if index in self.done:
            return
        if index and 0 not in self.done:
            self.ensure(0)
        started = time.monotonic()
        self.lab.run_cell(index, timeout=timeout)
        self.seconds[index] = time.monotonic() - started
        self.done.add(index)

    def text(self, index: int) -> str:
        """The visible text of cell `index`'s outputs (widgets' own output areas included)."""
        return self.lab.cell(index).locator(".jp-Cell-outputArea").inner_text()

    def stderr_lines(self, index: int) -> list[str]:
        texts = self.lab.cell(index).locator(STDERR).all_inner_texts()
        return [line for text in texts for line in text.splitlines()]


@pytest.fixture(scope="module")
def page(browser: Any, jupyter_lab: JupyterLab, artifacts_dir: Path) -> Iterator[MulticardPage]:
    """One page and one kernel for this module's tests (the lab fixture's, kept for the module)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, device_scale_factor=1)
    lab = LabPage(context.new_page(), jupyter_lab, artifacts_dir)
    lab.page.set_default_timeout(60_000)
    jupyter_lab.write_notebook(NOTEBOOK, CELLS)
    for stale in jupyter_lab.notebook_dir.glob("workers_*.txt"):
        stale.unlink()
    try:
        lab.open_notebook(NOTEBOOK, timeout=120)
        lab.hide_side_panels()
        yield MulticardPage(lab)
    finally:
        with contextlib.suppress(Exception):
            lab.save_console("multicard")
            lab.screenshot("multicard-final")
        context.close()
        jupyter_lab.shutdown_kernels()


@pytest.mark.parametrize("name", list(STRATEGY_CELLS))
def test_two_card_fit_returns_the_trained_weights_to_the_notebook(page: MulticardPage, name: str) -> None:
    index = STRATEGY_CELLS[name]
    page.ensure(index)
    text = page.text(index)
    found = re.search(rf"WEIGHTS {name} initial=(\w+) notebook=(\w+) workers=(\w+)", text)
    assert found, text[-3000:]
    initial, notebook, workers = found.groups()
    assert notebook != initial, text[-3000:]  # trained, not the notebook's initial model
    assert notebook == workers, text[-3000:]  # exactly the weights the workers ended with
    if name != "fabric":  # issue 39: the loops' progress and logged metrics come back too (Lightning's gives 0 / {})
        progress = re.search(rf"PROGRESS {name} epoch=(\d+) step=(\d+) logged=(.*)", text)
        assert progress and progress.group(1, 2) == ("1", "4"), text[-3000:]  # 32 samples a rank, batches of 8
        assert "'train_loss'" in progress.group(3), progress.group(3)
    print(f"\n{name}: cell ran in {page.seconds.get(index, 0):.1f} s")


@pytest.mark.parametrize("name", list(STRATEGY_CELLS))
def test_two_card_fit_shows_no_stderr_the_user_did_not_cause(page: MulticardPage, name: str) -> None:
    index = STRATEGY_CELLS[name]
    page.ensure(index)
    lines = page.stderr_lines(index)
    unexpected = [line for line in lines if not any(re.fullmatch(p, line.strip()) for p in EXPECTED_STDERR)]
    assert unexpected == [], "\n".join(unexpected)
    if name != "fabric":  # the selector finds the red outputs: Lightning's own last line is among them
        assert any(line.startswith("`Trainer.fit` stopped") for line in lines), lines


RANK_POINTS = """(i) => { const cell = window.jupyterapp.shell.currentWidget.content.widgets[i].node;
    const count = (s) => { const p = cell.querySelector(`svg.hpu-tc-chart path[data-series='${s}']`);
        return p && p.getAttribute('d') ? (p.getAttribute('d').match(/[ML]/g) || []).length : 0; };
    return [count('InUse'), count('rank1'),
            window.jupyterapp.shell.currentWidget.content.widgets[i].model.executionCount === null]; }"""


# the chart's legend entries and the rank lines' styles; the progress bars anywhere in the cell's outputs (the
# innermost output elements, a widget's own outputs included) and what each says
CHART_PARTS = """(i) => { const cell = window.jupyterapp.shell.currentWidget.content.widgets[i].node;
    const legend = Array.from(cell.querySelectorAll('.hpu-tc-legend-item'))
        .map((e) => [e.getAttribute('data-series'), e.textContent]);
    const styles = Array.from(cell.querySelectorAll("svg.hpu-tc-chart path.hpu-tc-rank")).map((p) =>
        [p.getAttribute('data-series'), p.getAttribute('stroke'), p.getAttribute('stroke-width'),
         p.getAttribute('stroke-dasharray')]);
    const bars = Array.from(cell.querySelectorAll('.jp-OutputArea-output'))
        .filter((e) => !e.querySelector('.jp-OutputArea-output') && /Epoch \\d+\\/\\d+/.test(e.innerText))
        .map((e) => e.innerText.trim());
    return { legend, styles, bars }; }"""


def test_memory_monitor_on_two_cards_draws_both_ranks_live(page: MulticardPage) -> None:
    lab = page.lab
    page.ensure(0)
    lab.run_cell(MONITOR_CELL, wait=False)
    started = time.monotonic()
    seen: list[tuple[int, int]] = []
    trace: list[tuple[float, int, int, bool]] = []
    shot = None
    while time.monotonic() - started < 300:
        rank0, rank1, running = lab.page.evaluate(RANK_POINTS, MONITOR_CELL)
        trace.append((round(time.monotonic() - started, 1), rank0, rank1, running))
        if not running:
            break
        if rank0 and rank1 and (not seen or (rank0, rank1) != seen[-1]):
            seen.append((rank0, rank1))
            if len(seen) == 3:
                live = lab.cell(MONITOR_CELL).locator(".jp-Cell-outputArea")
                shot = lab.screenshot("memory_monitor_2cards_live", live)
        time.sleep(0.1)
    lab.wait_for_cell(MONITOR_CELL, timeout=300)
    page.seconds[MONITOR_CELL] = time.monotonic() - started
    page.done.add(MONITOR_CELL)
    # both ranks drawn while the cell ran, each with a growing number of points
    assert len(seen) >= 3, f"the ranks' lines did not grow while training: {seen}; (t, rank0, rank1, running): {trace}"
    assert [r0 for r0, _ in seen] == sorted(r0 for r0, _ in seen) and seen[-1][0] > seen[0][0], seen
    assert [r1 for _, r1 in seen] == sorted(r1 for _, r1 in seen) and seen[-1][1] > seen[0][1], seen
    output = lab.cell(MONITOR_CELL).locator(".jp-Cell-outputArea")
    assert output.locator(".hpu-tc[data-status='done']").count() == 1
    final = lab.page.evaluate(RANK_POINTS, MONITOR_CELL)
    # rank 1 at every training step of the 480 samples / (2 ranks x batch 8); rank 0's InUse at every batch and at
    # the starting point
    assert final[1] == 30 and final[0] >= 31, final
    summary = output.locator(".hpu-tc-summary").inner_text()
    assert "rank 0" in summary and "rank 1" in summary, summary
    parts = lab.page.evaluate(CHART_PARTS, MONITOR_CELL)
    # issue 20: both ranks named in the legend and drawn apart (they use the same memory here); issue 39: one entry
    # per rank and series (rank 0's InUse once, not as "InUse (rank 0)" and "rank 0 InUse")
    legend = dict(parts["legend"])
    assert legend.get("InUse") == "rank 0 InUse" and legend.get("MaxInUse") == "rank 0 MaxInUse", parts["legend"]
    assert legend.get("rank1") == "rank 1 InUse" and "rank0" not in legend, parts["legend"]
    assert [text for _, text in parts["legend"]].count("rank 0 InUse") == 1, parts["legend"]
    styles = {series: tuple(style) for series, *style in parts["styles"]}
    assert sorted(styles) == ["rank1"] and styles["rank1"][2], styles  # rank 1 dashed over rank 0's InUse line
    # one progress bar (Lightning's, drawn by the forked rank 0), at the last step: 480 samples / (2 ranks x batch 8)
    assert len(parts["bars"]) == 1 and re.search(r"\b30/30\b", parts["bars"][0]), parts["bars"]
    unexpected = [line for line in page.stderr_lines(MONITOR_CELL)
                  if not any(re.fullmatch(p, line.strip()) for p in EXPECTED_STDERR)]
    assert unexpected == [], "\n".join(unexpected)  # no "all_gather is deprecated"
    final_shot = lab.screenshot("memory_monitor_2cards", output)
    lab.publish(final_shot, "memory_monitor_2cards.png")
    print(f"\nmonitor cell ran in {page.seconds[MONITOR_CELL]:.1f} s; live states {seen}; live shot {shot}")


# -- interrupting a 2-card fit from the toolbar: one line, busy until it ends, a kernel that trains again -------------
INTERRUPT_NOTEBOOK = "multicard_interrupt.ipynb"
INTERRUPT_CELLS = [
    SETUP + '''

class StepLog(L.Callback):
    """In the workers' rank 0: the step just done, for the test to interrupt at."""
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_rank == 0:
            pathlib.Path("step.txt").write_text(str(trainer.global_step))

class SlowModel(Model):
    def training_step(self, batch, batch_idx):
        time.sleep(0.15)
        return super().training_step(batch, batch_idx)

def slow_fit(epochs):
    pathlib.Path("step.txt").unlink(missing_ok=True)
    L.seed_everything(7, verbose=False)
    trainer = L.Trainer(accelerator="hpu", devices=2, max_epochs=epochs, logger=False, enable_checkpointing=False,
                        enable_model_summary=False, strategy="hpu_ddp", callbacks=[StepLog()])
    trainer.fit(model, data(n=480))''',
    "model = SlowModel()\nslow_fit(epochs=20)",
    "before = checksum(model.state_dict().items())\nslow_fit(epochs=1)\n"
    "print('TRAINED AGAIN', before != checksum(model.state_dict().items()), pathlib.Path('step.txt').read_text())",
]
STATUS = """() => { const c = window.jupyterapp.shell.currentWidget.sessionContext;
    return [c.session && c.session.kernel ? c.session.kernel.status : 'none', c.kernelDisplayStatus]; }"""


def test_interrupting_a_two_card_fit_leaves_one_line_and_a_kernel_that_trains(lab: LabPage, jupyter_lab) -> None:
    """Issue 31, item 4, from JupyterLab's Interrupt command (SIGINT to the kernel's process group): the cell ends
    with one line naming the step whose weights the model holds, no other red output; the kernel is busy from the
    run to that line, then idle; the next cell's fit trains."""
    jupyter_lab.write_notebook(INTERRUPT_NOTEBOOK, INTERRUPT_CELLS)
    step_file = jupyter_lab.notebook_dir / "step.txt"
    lab.open_notebook(INTERRUPT_NOTEBOOK, timeout=120)
    lab.hide_side_panels()
    try:
        lab.run_cell(0, timeout=120)
        lab.run_cell(1, wait=False)
        deadline = time.monotonic() + 180
        while not (step_file.exists() and step_file.read_text().strip() not in ("", "0", "1", "2")):
            assert time.monotonic() < deadline, "the fit did not reach step 3"
            time.sleep(0.1)
        running = [lab.page.evaluate(STATUS) for _ in range(3)]
        assert all(s == ["busy", "busy"] for s in running), running  # the status bar says busy while it runs
        lab.page.evaluate("() => window.jupyterapp.commands.execute('kernelmenu:interrupt')")
        states = []
        while lab.page.evaluate("() => window.jupyterapp.shell.currentWidget.content.widgets[1]"
                                ".model.executionCount === null") or lab.page.evaluate(STATUS)[0] != "idle":
            states.append(tuple(lab.page.evaluate(STATUS)))
            assert time.monotonic() < deadline + 60, states[-5:]
            time.sleep(0.05)
        # busy until the cell's end (no idle while the workers stopped), idle after
        assert all(s == ("busy", "busy") for s in states[:-1] if s[0] != "idle") and "idle" not in [
            s[0] for s in states[: -3 or None]], states
        red = lab.cell(1).locator(STDERR).all_inner_texts()
        text = lab.cell(1).locator(".jp-Cell-outputArea").inner_text()
        lines = [line for line in text.splitlines() if line.startswith("Stopped by you")]
        assert len(lines) == 1 and re.fullmatch(
            r"Stopped by you after (\d+) steps: the model you passed to fit\(\) has the weights of step \1\.",
            lines[0]), text[-2000:]
        for noise in ("SIGTERM", "SystemExit", "To exit", "Traceback", "KeyboardInterrupt", "Detected"):
            assert noise not in text, (noise, text[-2000:])
        # red: Lightning's lines of a fit (and its hint where a `srun` is on the PATH), and the one line
        allowed = (*EXPECTED_STDERR, r".*slurm\.py:\d+: The `srun` command is available.*", re.escape(lines[0]))
        unexpected = [line for t in red for line in t.splitlines()
                      if line.strip() and not any(re.fullmatch(p, line.strip()) for p in allowed)]
        assert unexpected == [], unexpected
        shot = lab.screenshot("multicard_interrupted", lab.cell(1))
        lab.publish(shot, "multicard_interrupted.png")

        lab.run_cell(2, timeout=240)
        assert "TRAINED AGAIN True 30" in lab.cell(2).locator(".jp-Cell-outputArea").inner_text()
    finally:
        lab.save_console("multicard-interrupt")

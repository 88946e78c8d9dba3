"""In a real JupyterLab + Chromium: %hpu_info, MemoryMonitor's chart live during fit (and after an OOM run),
TrainerConfigWidget clicks changing the code, Copy, and insert_cell(). Screenshots go to the artifacts folder
(and to docs/screenshots/ with HPU_NB_UPDATE_SCREENSHOTS=1)."""

from __future__ import annotations

import time

CELLS = [
    "%load_ext hpu_nb\n%hpu_info",
    # 1: a small model; the sleep keeps each step ~30 ms so the chart has time to move on any machine
    """import logging, time, warnings
import lightning as L, torch, hpu_nb
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)  # keep the screenshots clean
warnings.filterwarnings("ignore")
from torch.utils.data import DataLoader, TensorDataset

class Net(L.LightningModule):
    def __init__(self, width=512):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width))
    def training_step(self, batch, i):
        time.sleep(0.03)
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)
    def validation_step(self, batch, i):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)

def data(width=512, n=960, batch=16):
    x = torch.randn(n, width)
    return DataLoader(TensorDataset(x, torch.randn_like(x)), batch_size=batch)

quiet = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)""",
    # 2: training with the live chart
    """monitor = hpu_nb.MemoryMonitor(update_interval=0.1)
trainer = L.Trainer(accelerator="hpu", callbacks=[monitor], max_epochs=2, limit_val_batches=10, **quiet)
trainer.fit(Net(), data(), data(n=160))""",
    # 3: the same on a card with a 24 MiB Limit: out of memory
    """from hpu_nb.runtime import set_backend
from hpu_nb.runtime.emulated import EmulatedBackend
set_backend(EmulatedBackend(memory_limit="24MiB"))
oom_monitor = hpu_nb.MemoryMonitor(update_interval=0.1)
try:
    L.Trainer(accelerator="hpu", callbacks=[oom_monitor], max_epochs=1, **quiet).fit(
        Net(width=1536), data(width=1536, n=64))
except hpu_nb.HPUOutOfMemoryError as err:
    print("out of memory:", str(err)[:90])
set_backend(None)""",
    # 4: the configuration form
    "cfg = hpu_nb.TrainerConfigWidget(devices=1)\ncfg",
    # 5: the code as a new cell below
    "cfg.insert_cell()",
]


def _npoints(lab, index: int) -> int:  # noqa: ANN001
    return lab.page.evaluate(
        """(i) => { const cell = window.jupyterapp.shell.currentWidget.content.widgets[i].node;
            const svg = cell.querySelector('svg.hpu-mem-chart');
            return svg ? Number(svg.getAttribute('data-npoints') || 0) : -1; }""", index)


def test_monitor_and_config_widget_in_jupyterlab(lab, jupyter_lab) -> None:  # noqa: ANN001
    jupyter_lab.write_notebook("browser_monitor.ipynb", CELLS)
    started = time.monotonic()
    lab.open_notebook("browser_monitor.ipynb")
    lab.hide_side_panels()
    try:
        _check(lab)
    finally:
        lab.save_console("notebook")
        lab.screenshot("notebook-final")
    print(f"\nbrowser test took {time.monotonic() - started:.1f} s; screenshots in {lab.artifacts}")


def _check(lab) -> None:  # noqa: ANN001
    # %hpu_info says plainly that the Gaudi is emulated
    lab.run_cell(0)
    info = lab.cell_text(0)
    assert "Emulated Gaudi on the CPU" in info and "HPU_NB_BACKEND" in info
    lab.publish(lab.screenshot("hpu_info", lab.cell(0).locator(".jp-OutputArea")), "hpu_info.png")

    lab.run_cell(1, timeout=120)

    # the chart renders and changes while the cell is still running
    lab.run_cell(2, wait=False)
    seen: list[int] = []
    trace: list[tuple[float, bool, int]] = []
    t0 = time.monotonic()
    deadline = t0 + 120
    while time.monotonic() < deadline:
        running = lab.page.evaluate(
            "() => window.jupyterapp.shell.currentWidget.content.widgets[2].model.executionCount === null")
        n = _npoints(lab, 2)
        trace.append((round(time.monotonic() - t0, 2), running, n))
        if running and n > 0 and (not seen or n != seen[-1]):
            seen.append(n)
            if len(seen) == 3:
                lab.screenshot("memory_monitor_live", lab.cell(2).locator(".jp-OutputArea"))
        if not running:
            break
        time.sleep(0.1)
    lab.wait_for_cell(2)
    assert len(seen) >= 3, f"the chart did not update live while training: {seen}; (t, running, points): {trace}"
    assert seen == sorted(seen), seen
    final = _npoints(lab, 2)
    assert final >= 121, final  # start + 120 train batches (+ validation), all in the chart
    output = lab.cell(2).locator(".jp-OutputArea")
    assert output.locator(".hpu-mem[data-status='done']").count() == 1
    assert output.locator("path[data-series='InUse']").count() == 1
    assert "emulated" in output.locator(".hpu-mem-badge").inner_text()
    assert "headroom" in output.locator(".hpu-mem-counters").inner_text()
    shot = lab.screenshot("memory_monitor", output)
    lab.publish(shot, "memory_monitor.png")

    # an out-of-memory run: the chart marks where the Limit was hit
    lab.run_cell(3, timeout=120)
    oom = lab.cell(3).locator(".jp-OutputArea")
    assert "out of memory" in oom.inner_text()
    assert oom.locator(".hpu-mem[data-status='oom']").count() == 1
    assert "OOM" in (oom.locator("text.hpu-mem-oom").text_content() or "")
    shot = lab.screenshot("memory_monitor_oom", oom)
    lab.publish(shot, "memory_monitor_oom.png")

    # the configuration form: clicks change the generated code
    lab.run_cell(4)
    form = lab.cell(4).locator(".jp-OutputArea")
    code = form.locator("pre.hpu-cfg-code")
    code.wait_for()
    before = code.inner_text()
    assert 'precision="32-true"' in before
    form.locator(".hpu-cfg-row-precision select").select_option(label="bf16-mixed")
    lab.page.wait_for_function(
        """() => { const pre = window.jupyterapp.shell.currentWidget.content.widgets[4].node
                .querySelector('pre.hpu-cfg-code');
            return pre && pre.textContent.includes('precision="bf16-mixed"'); }""")
    form.locator(".hpu-cfg-row-monitor input[type=checkbox]").check()
    lab.page.wait_for_function(
        """() => window.jupyterapp.shell.currentWidget.content.widgets[4].node.querySelector('pre.hpu-cfg-code')
            .textContent.includes('callbacks=[MemoryMonitor()]')""")
    form.locator(".hpu-cfg-row-devices input").fill("2")
    form.locator(".hpu-cfg-row-devices input").press("Enter")
    # invalid with 2 devices: an error shows
    form.locator(".hpu-cfg-row-strategy select").select_option(label="single device (hpu_single)")
    form.locator(".hpu-cfg-error").first.wait_for()
    assert "single-device strategy" in form.locator(".hpu-cfg-issues").inner_text()
    shot = lab.screenshot("config_widget_error", form)
    form.locator(".hpu-cfg-row-strategy select").select_option(label="parallel / DDP over HCCL (hpu_parallel)")
    lab.page.wait_for_function(
        """() => window.jupyterapp.shell.currentWidget.content.widgets[4].node.querySelector('.hpu-cfg-panel')
            .getAttribute('data-errors') === '0'""")
    after = code.inner_text()
    assert after != before and 'strategy="hpu_parallel"' in after and "devices=2" in after
    form.locator("button.hpu-cfg-copy").click()
    lab.page.wait_for_function(
        "() => window.jupyterapp.shell.currentWidget.content.widgets[4].node.querySelector('.hpu-cfg-panel')"
        ".hasAttribute('data-copied')")
    copied = form.locator(".hpu-cfg-panel").get_attribute("data-copied")
    assert copied == "yes"
    try:
        clip = lab.page.evaluate("() => navigator.clipboard.readText()")
    except Exception:  # noqa: BLE001 - reading the clipboard may be refused; the copy itself succeeded
        clip = None
    if clip is not None:
        assert clip.strip() == after.strip()
    shot = lab.screenshot("config_widget", form)
    lab.publish(shot, "config_widget.png")

    # the kernel saw the clicks: insert_cell() puts the same code in a new cell below
    cells = lab.cell_count()
    lab.run_cell(5)
    lab.page.wait_for_function(f"() => window.jupyterapp.shell.currentWidget.content.widgets.length > {cells}")
    inserted = lab.cell_source(6)
    assert inserted.strip() == after.strip(), inserted

"""The config widget's DeepSpeed ZeRO-3 + offload code, run in a notebook kernel as a newcomer runs it (issue 31).

A notebook trains through a forked worker even on one card (the kernel keeps no card). The kernel had used torch's
OpenMP thread pool before (any sizeable matmul does), and a forked child of such a process hung in its first parallel
region: the fit printed "Enabling DeepSpeed BF16" and nothing more.
"""

from __future__ import annotations

import json
import os

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("deepspeed")

MODEL = """
import json, torch, lightning as L, hpu_nb
from deepspeed.ops.adam import DeepSpeedCPUAdam

torch.manual_seed(0)
teacher = torch.nn.Linear(64, 8)
inputs = torch.randn(2048, 64)
targets = teacher(inputs).detach()  # a matmul in the kernel: torch's OpenMP pool is started here
torch.randn(512, 512) @ torch.randn(512, 512)

class Student(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                       torch.nn.ReLU(), torch.nn.Linear(256, 8))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x).float(), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return DeepSpeedCPUAdam(self.parameters(), lr=1e-3)

data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(inputs, targets), batch_size=64)
"""

# the form's defaults as a newcomer leaves them (its logger: TensorBoard where installed, else none), checkpoints asked
WIDGET_CODE = """
exec(hpu_nb.TrainerConfig(strategy="deepspeed", deepspeed_stage=3, offload_optimizer=True, precision="bf16-mixed",
                          checkpointing=True).code)
"""

FIT = """
trainer.fit(Student(), data)
print(json.dumps({"epochs": trainer.current_epoch, "threads_here": torch.get_num_threads()}))
"""


@pytest.mark.timeout(600)
def test_widget_zero3_offload_code_trains_three_epochs_in_a_kernel_without_barrier_warnings(tmp_path) -> None:
    """...and, with the form's logger and checkpoints, no `lightning_logs` folder, no tensorboardX warning, and no
    barrier warning from DeepSpeed's checkpoint saving either (issue 39)."""
    # the kernel spec names the environment's extensions folder: a TORCH_EXTENSIONS_DIR given to the tests wins
    ext = os.environ.get("TORCH_EXTENSIONS_DIR")
    setup = f"import os; os.environ['TORCH_EXTENSIONS_DIR'] = {ext!r}" if ext else "pass"
    cells = (setup, MODEL, WIDGET_CODE, FIT)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in cells])
    nbclient.NotebookClient(nb, timeout=480, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
                            ).execute()  # a hang fails here, naming the cell
    outputs = [o for cell in nb.cells[2:] for o in cell.outputs]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    report = json.loads([line for line in text.splitlines() if line.startswith("{")][-1])
    assert "`max_epochs=3` reached" in text
    assert report["threads_here"] >= 1  # the kernel's own thread count is left as it was
    assert "barrier()" not in text and "Traceback" not in text
    assert "tensorboardX" not in text and "lightning[extra]" not in text
    written = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")}
    assert not any("lightning_logs" in p for p in written), sorted(written)
    assert any("checkpoints/epoch=2" in p for p in written), sorted(written)  # the form's checkpoints, where it said

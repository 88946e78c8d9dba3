"""Code written the way Gaudi code is written runs unchanged on the emulated Gaudi.

No hpu_nb helper is called here: tensors go to "hpu", autocast is `torch.autocast("hpu")`, the device is asked through
`torch.hpu` and `habana_frameworks.torch.*`, and Lightning is told `accelerator="hpu"`. (pytest's conftest imports
hpu_nb; the last test runs such a script in a fresh interpreter that never imports it.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import habana_frameworks.torch.core as htcore
import habana_frameworks.torch.hpu as hthpu
import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

DEVICE = torch.device("hpu")


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def test_a_plain_torch_training_loop_with_mark_step():
    torch.manual_seed(0)
    model = Net().to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    x = torch.randn(64, 16).to(DEVICE)
    y = torch.randint(0, 4, (64,)).to(DEVICE)
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        with torch.autocast(device_type="hpu", dtype=torch.bfloat16):
            logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.float(), y)
        loss.backward()
        htcore.mark_step()
        optimizer.step()
        htcore.mark_step()
        losses.append(loss.item())
    hthpu.synchronize()
    assert logits.dtype == torch.bfloat16 and logits.device.type == "hpu"
    assert losses[-1] < losses[0] / 3
    stats = hthpu.memory_stats()
    assert stats["InUse"] > 0 and stats["MaxInUse"] >= stats["InUse"]
    assert hthpu.get_device_name() in ("GAUDI", "GAUDI2", "GAUDI3") and hthpu.is_available()
    assert torch.hpu.device_count() >= 1 and torch.hpu.current_device() == 0


def test_save_and_restore_a_checkpoint_on_the_device(tmp_path):
    model = Net().to("hpu")
    torch.save(model.state_dict(), tmp_path / "net.pt")
    restored = Net()
    restored.load_state_dict(torch.load(tmp_path / "net.pt", map_location="hpu"))
    restored.to("hpu")
    x = torch.randn(2, 16, device="hpu")
    assert torch.equal(restored(x).cpu(), model(x).cpu())


class LitClassifier(L.LightningModule):
    """lightning-habana's documented native-autocast pattern: torch.autocast(device_type="hpu") inside forward."""

    def __init__(self) -> None:
        super().__init__()
        self.net = Net()
        self.dtypes: list[torch.dtype] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type="hpu", dtype=torch.bfloat16):
            return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.dtypes.append(logits.dtype)
        loss = torch.nn.functional.cross_entropy(logits.float(), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_lightning_with_accelerator_hpu_and_native_autocast():
    gen = torch.Generator().manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(64, 16, generator=gen), torch.randint(0, 4, (64,), generator=gen)),
                      batch_size=16)
    model = LitClassifier()
    trainer = L.Trainer(accelerator="hpu", devices=1, max_epochs=2, logger=False, enable_progress_bar=False,
                        enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(model, data)
    assert trainer.strategy.root_device.type == "hpu"
    assert model.dtypes and set(model.dtypes) == {torch.bfloat16}  # bf16 for real, as on a Gaudi
    assert torch.isfinite(trainer.callback_metrics["train_loss"])


def test_a_gaudi_script_runs_in_a_fresh_interpreter_that_never_imports_hpu_nb(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        import habana_frameworks.torch.core as htcore
        import lightning as L
        from torch.utils.data import DataLoader, TensorDataset

        class Lit(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(8, 1)
            def training_step(self, batch, batch_idx):
                with torch.autocast(device_type="hpu", dtype=torch.bfloat16):
                    out = self.layer(batch[0])
                return torch.nn.functional.mse_loss(out.float(), batch[1])
            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        data = DataLoader(TensorDataset(torch.randn(32, 8), torch.randn(32, 1)), batch_size=8)
        trainer = L.Trainer(accelerator="hpu", devices=1, max_epochs=1, logger=False, enable_progress_bar=False,
                            enable_checkpointing=False, enable_model_summary=False)
        trainer.fit(Lit(), data)
        htcore.mark_step()
        print(type(trainer.strategy).__name__, trainer.strategy.root_device, torch.hpu.get_device_name())
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPU_NB_", "PT_HPU_"))}
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["SingleHPUStrategy", "hpu:0", "GAUDI2"]

"""LightningCLI accepts --trainer.accelerator=hpu --trainer.strategy=hpu_single."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("jsonargparse")

_SCRIPT = """
import torch, hpu_nb
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.demos.boring_classes import BoringModel, BoringDataModule
cli = LightningCLI(BoringModel, BoringDataModule, run=False, save_config_callback=None)
print(type(cli.trainer.accelerator).__name__, type(cli.trainer.strategy).__name__)
cli.trainer.fit(cli.model, cli.datamodule)
print("steps", cli.trainer.global_step)
"""


def test_lightning_cli_trains_on_hpu(tmp_path):
    args = [
        "--trainer.accelerator=hpu",
        "--trainer.strategy=hpu_single",
        "--trainer.max_steps=3",
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_checkpointing=false",
        f"--trainer.default_root_dir={tmp_path}",
    ]
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_SCRIPT), *args], capture_output=True, text=True, timeout=180,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert "HPUAccelerator SingleHPUStrategy" in lines
    assert "steps 3" in lines

"""HPUCheckpointIO: CPU tensors on disk, atomic writes (proved by killing a saving process), loads onto the device."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import lightning as L
import pytest
import torch

from hpu_nb import HPUCheckpointIO
from tests.models import LinearModel, quiet_trainer_kwargs, regression_data


def test_round_trip(tmp_path):
    io = HPUCheckpointIO()
    path = tmp_path / "sub" / "model.ckpt"
    state = {"w": torch.arange(6.0).reshape(2, 3), "nested": [{"b": torch.ones(2, dtype=torch.bfloat16)}], "step": 7}
    io.save_checkpoint(state, path)
    loaded = io.load_checkpoint(path)
    assert torch.equal(loaded["w"], state["w"]) and loaded["step"] == 7
    assert loaded["nested"][0]["b"].dtype == torch.bfloat16
    assert loaded["w"].device.type == "cpu"  # the emulated Gaudi's device
    assert [p.name for p in path.parent.iterdir()] == ["model.ckpt"]  # no temporary files left behind


def test_storage_options_are_rejected(tmp_path):
    with pytest.raises(TypeError, match="storage_options"):
        HPUCheckpointIO().save_checkpoint({"a": 1}, tmp_path / "x.ckpt", storage_options={"compress": True})


def test_missing_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.ckpt"):
        HPUCheckpointIO().load_checkpoint(tmp_path / "nothing.ckpt")


def test_device_tensors_are_moved_to_cpu_before_saving(tmp_path, monkeypatch):
    moved = []
    real_cpu = torch.Tensor.cpu

    class FakeDeviceTensor(torch.Tensor):
        """A tensor that claims to live on an HPU, to check we call .cpu() on it."""

        @property
        def device(self):  # noqa: ANN201
            return torch.device("hpu")

        def cpu(self, *a, **k):  # noqa: ANN002, ANN003, ANN201
            moved.append(True)
            return real_cpu(self.as_subclass(torch.Tensor))

    tensor = torch.ones(3).as_subclass(FakeDeviceTensor)
    HPUCheckpointIO().save_checkpoint({"t": tensor}, tmp_path / "c.ckpt")
    assert moved == [True]
    assert type(torch.load(tmp_path / "c.ckpt")["t"]) is torch.Tensor


_SAVER = """
import sys, torch
from hpu_nb import HPUCheckpointIO
path = sys.argv[1]
big = {"w": torch.full((64, 1024, 1024), 2.0)}  # 256 MiB: long enough to be killed mid-write
print("saving", flush=True)
while True:
    HPUCheckpointIO().save_checkpoint(big, path)
"""


def test_killing_a_saving_process_never_corrupts_the_previous_checkpoint(tmp_path):
    path = tmp_path / "last.ckpt"
    HPUCheckpointIO().save_checkpoint({"w": torch.full((4,), 1.0), "version": 1}, path)
    before = path.read_bytes()
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_SAVER), str(path)], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "saving"
        deadline = time.monotonic() + 60
        while not any(p.name.endswith(".tmp") and p.stat().st_size > 1 << 20 for p in tmp_path.iterdir()):
            assert time.monotonic() < deadline, "the saver never started writing"
            time.sleep(0.005)
        assert path.read_bytes() == before  # mid-write, the old checkpoint is untouched
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    loaded = HPUCheckpointIO().load_checkpoint(path)  # either the old or a complete new one, never a torn file
    if loaded.get("version") == 1:
        assert torch.equal(loaded["w"], torch.full((4,), 1.0))
    else:
        assert loaded["w"].shape == (64, 1024, 1024) and bool((loaded["w"] == 2.0).all())


def test_trainer_checkpoints_resume_on_hpu(tmp_path):
    data = regression_data(n=32, features=16, batch_size=8)
    trainer = L.Trainer(**quiet_trainer_kwargs(accelerator="hpu", max_steps=4, default_root_dir=tmp_path))
    model = LinearModel(16)
    trainer.fit(model, data)
    ckpt = tmp_path / "manual.ckpt"
    trainer.save_checkpoint(ckpt)
    resumed = LinearModel(16)
    trainer2 = L.Trainer(**quiet_trainer_kwargs(accelerator="hpu", max_epochs=10, max_steps=8,
                                                default_root_dir=tmp_path))
    trainer2.fit(resumed, data, ckpt_path=ckpt)
    assert trainer2.global_step == 8
    restored = LinearModel.load_from_checkpoint(ckpt, features=16)
    assert torch.equal(restored.layer.weight, model.layer.weight)

"""HPUCheckpointIO: CPU tensors on disk, atomic writes (proved by killing a saving process), loads onto the device."""

from __future__ import annotations

import errno
import io
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import lightning as L
import pytest
import torch

from hpu_nb import HPUCheckpointIO
from hpu_nb.core import checkpoint_io
from hpu_nb.core.checkpoint_io import InvalidCheckpointError
from tests.helpers.models import LinearModel, quiet_trainer_kwargs, regression_data


def test_round_trip(tmp_path):
    io = HPUCheckpointIO()
    path = tmp_path / "sub" / "model.ckpt"
    state = {"w": torch.arange(6.0).reshape(2, 3), "nested": [{"b": torch.ones(2, dtype=torch.bfloat16)}], "step": 7}
    io.save_checkpoint(state, path)
    loaded = io.load_checkpoint(path)
    assert loaded["w"].device == torch.device("hpu", 0)  # loaded onto this process's card
    assert torch.equal(loaded["w"].cpu(), state["w"]) and loaded["step"] == 7
    assert loaded["nested"][0]["b"].dtype == torch.bfloat16
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
        def device(self):
            return torch.device("hpu")

        def cpu(self, *a, **k):
            moved.append(True)
            return real_cpu(self.as_subclass(torch.Tensor))

    tensor = torch.ones(3).as_subclass(FakeDeviceTensor)
    HPUCheckpointIO().save_checkpoint({"t": tensor}, tmp_path / "c.ckpt")
    assert moved == [True]
    assert type(torch.load(tmp_path / "c.ckpt")["t"]) is torch.Tensor


_SAVER = """
import sys, torch
from hpu_nb import HPUCheckpointIO
from hpu_nb.core import checkpoint_io
from hpu_nb.core.checkpoint_io import InvalidCheckpointError
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
        assert torch.equal(loaded["w"].cpu(), torch.full((4,), 1.0))
    else:
        assert loaded["w"].shape == (64, 1024, 1024) and bool((loaded["w"] == 2.0).all())


def test_the_next_save_removes_the_temp_file_a_killed_saver_left(tmp_path):
    path = tmp_path / "last.ckpt"
    HPUCheckpointIO().save_checkpoint({"w": torch.full((4,), 1.0), "version": 1}, path)
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_SAVER), str(path)], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "saving"
        deadline = time.monotonic() + 60
        while not (leftovers := [p for p in tmp_path.iterdir()
                                 if p.name.endswith(".tmp") and p.stat().st_size > 1 << 20]):
            assert time.monotonic() < deadline, "the saver never started writing"
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert all(p.exists() for p in leftovers)  # the crash left its temporary file, as a crash does
    assert leftovers[0].name.startswith(".last.ckpt.")

    # a temporary file of a live process (another saver) is not touched
    live = tmp_path / f".last.ckpt.{checkpoint_io._HOST}-{os.getppid()}.abc123.tmp"
    live.write_bytes(b"being written")
    # a dead saver's temporary file of another checkpoint goes too (ModelCheckpoint's epoch/step names never repeat)
    other = tmp_path / f".epoch=3-step=40.ckpt.{checkpoint_io._HOST}-{proc.pid}.abc123.tmp"
    other.write_bytes(b"x")
    # and a live saver's of another checkpoint stays, as does a file that is not ours
    live_other = tmp_path / f".epoch=4-step=50.ckpt.{checkpoint_io._HOST}-{os.getppid()}.abc123.tmp"
    live_other.write_bytes(b"being written")
    not_ours = tmp_path / f".notes.{proc.pid}.tmp"
    not_ours.write_bytes(b"someone else's")

    HPUCheckpointIO().save_checkpoint({"w": torch.full((4,), 3.0), "version": 3}, path)
    assert not any(p.exists() for p in leftovers) and not other.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["last.ckpt", live.name, live_other.name,
                                                                 not_ours.name])
    assert HPUCheckpointIO().load_checkpoint(path)["version"] == 3


def test_a_full_disk_is_a_clear_error_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    """The temporary file is opened on /dev/full: every write fails with the kernel's real ENOSPC."""
    path = tmp_path / "model.ckpt"
    HPUCheckpointIO().save_checkpoint({"version": 1}, path)
    before = path.read_bytes()
    real_mkstemp = tempfile.mkstemp

    def mkstemp_on_a_full_disk(*args, **kwargs):
        fd, name = real_mkstemp(*args, **kwargs)
        os.close(fd)
        return os.open("/dev/full", os.O_WRONLY), name

    monkeypatch.setattr(checkpoint_io.tempfile, "mkstemp", mkstemp_on_a_full_disk)
    with pytest.raises(OSError, match="disk is full") as info:
        HPUCheckpointIO().save_checkpoint({"w": torch.ones(1000)}, path)
    message = str(info.value)
    assert info.value.errno == errno.ENOSPC
    assert str(path) in message and "disk mounted at /" in message and "free of" in message
    assert "previous checkpoint at that path, if any, is intact" in message
    assert "inline_container" not in message
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.ckpt"]


class _CountingWriter(io.BufferedWriter):
    """The checkpoint's temporary file, counting torch.save's writes; raises KeyboardInterrupt at write `interrupt_at`
    (what Ctrl-C does when its signal lands while torch's C++ zip writer is inside the file's `write`)."""

    writes = 0
    interrupt_at: int | None = None

    def write(self, data):  # type: ignore[override]
        type(self).writes += 1
        if type(self).writes == self.interrupt_at:
            raise KeyboardInterrupt
        return super().write(data)


def test_ctrl_c_at_any_write_of_a_save_is_a_keyboard_interrupt_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    """Was `RuntimeError: [enforce fail at inline_container.cc] . unexpected pos` (torch's writer, on its way out,
    writing the zip's end at a position it no longer trusts), the KeyboardInterrupt hidden as its context."""
    path = tmp_path / "model.ckpt"
    HPUCheckpointIO().save_checkpoint({"version": 1}, path)
    before = path.read_bytes()
    monkeypatch.setattr(checkpoint_io.os, "fdopen", lambda fd, *args, **kwargs: _CountingWriter(io.FileIO(fd, "wb")))
    new_checkpoint = {"w": torch.randn(300), "b": torch.randn(7), "step": 3}
    HPUCheckpointIO().save_checkpoint(new_checkpoint, tmp_path / "uninterrupted.ckpt")
    writes_of_a_save = _CountingWriter.writes
    (tmp_path / "uninterrupted.ckpt").unlink()
    assert writes_of_a_save > 5
    for moment in range(1, writes_of_a_save + 1):
        monkeypatch.setattr(_CountingWriter, "writes", 0)
        monkeypatch.setattr(_CountingWriter, "interrupt_at", moment)
        with pytest.raises(KeyboardInterrupt) as info:
            HPUCheckpointIO().save_checkpoint(new_checkpoint, path)
        assert type(info.value) is KeyboardInterrupt, moment
        assert path.read_bytes() == before, moment
        assert [p.name for p in tmp_path.iterdir()] == ["model.ckpt"], moment
    assert torch.load(path, weights_only=True) == {"version": 1}


def test_an_empty_checkpoint_is_a_clear_error(tmp_path):
    path = tmp_path / "empty.ckpt"
    path.write_bytes(b"")
    with pytest.raises(InvalidCheckpointError, match=r"empty.ckpt: the file is empty \(0 bytes\)"):
        HPUCheckpointIO().load_checkpoint(path)


def test_a_garbage_checkpoint_is_a_clear_error(tmp_path):
    path = tmp_path / "garbage.ckpt"
    path.write_bytes(b"GARBAGE!" * 100)
    expected = r"garbage.ckpt: the file \(800 bytes, first bytes b'GARB'\) is not"
    with pytest.raises(InvalidCheckpointError, match=expected) as info:
        HPUCheckpointIO().load_checkpoint(path)
    assert "weights_only" not in str(info.value)


def test_a_checkpoint_cut_short_is_a_clear_error(tmp_path):
    path = tmp_path / "cut.ckpt"
    HPUCheckpointIO().save_checkpoint({"w": torch.ones(1000)}, path)
    path.write_bytes(path.read_bytes()[:1500])
    expected = r"cut.ckpt: the file \(1,500 bytes\) is a PyTorch checkpoint cut short"
    with pytest.raises(InvalidCheckpointError, match=expected):
        HPUCheckpointIO().load_checkpoint(path)


def test_a_valid_checkpoint_keeps_torchs_own_advice(tmp_path):
    """A real checkpoint holding a custom class: torch's weights_only advice is the right one there."""
    path = tmp_path / "custom.ckpt"
    HPUCheckpointIO().save_checkpoint({"obj": _Custom()}, path)
    with pytest.raises(Exception, match="weights_only") as info:
        HPUCheckpointIO().load_checkpoint(path, weights_only=True)
    assert not isinstance(info.value, InvalidCheckpointError)
    assert isinstance(HPUCheckpointIO().load_checkpoint(path, weights_only=False)["obj"], _Custom)


class _Custom:
    pass


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


def test_checkpoints_follow_the_umask_as_torch_save_does(tmp_path):
    """mkstemp's 0600 kept teammates from reading checkpoints in a shared folder."""
    previous = os.umask(0o022)
    try:
        HPUCheckpointIO().save_checkpoint({"w": torch.ones(2)}, tmp_path / "shared.ckpt")
        torch.save({"w": torch.ones(2)}, tmp_path / "plain.ckpt")
        os.umask(0o077)
        HPUCheckpointIO().save_checkpoint({"w": torch.ones(2)}, tmp_path / "private.ckpt")
    finally:
        os.umask(previous)
    mode = {name: (tmp_path / name).stat().st_mode & 0o777 for name in ("shared.ckpt", "plain.ckpt", "private.ckpt")}
    assert mode == {"shared.ckpt": 0o644, "plain.ckpt": 0o644, "private.ckpt": 0o600}


@pytest.mark.parametrize("keep", [0.5, 0.02])  # inside the tensor data (torch: "unexpected EOF"), inside the pickle
def test_a_cut_short_legacy_checkpoint_names_the_file(tmp_path, keep):
    """A bare EOFError with no message, before."""
    path = tmp_path / "old.ckpt"
    torch.save({"w": torch.arange(1000.0)}, path, _use_new_zipfile_serialization=False)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(InvalidCheckpointError, match=r"old\.ckpt.*legacy \(pre-zip\) format, cut short"):
        HPUCheckpointIO().load_checkpoint(path, map_location="cpu", weights_only=True)


# -- checkpoints from a URL (issue 28, item 1) ------------------------------------------------------------------------
class _Evil:
    """A pickle that creates a marker file when unpickled: what an attacker's checkpoint would do with os.system."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture
def served(tmp_path, monkeypatch):
    """A local HTTP server on 127.0.0.1 serving tmp_path/"www"; torch.hub's download cache kept inside tmp_path."""
    import functools
    import http.server
    import threading

    www = tmp_path / "www"
    www.mkdir()
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(www)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield www, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _evil_checkpoint(www, tmp_path, name="evil.ckpt"):
    marker = tmp_path / "pwned"
    model = LinearModel(4)
    torch.save({"state_dict": model.state_dict(), "payload": _Evil(str(marker))}, www / name)
    return marker


def test_a_checkpoint_url_loads_with_weights_only_and_never_runs_its_pickle(served, tmp_path):
    """Lightning's `_load` defaults to weights_only=False for URLs: the pickle's code ran. Now a URL is refused exactly
    as the same file on disk is (torch's weights_only error), and nothing in it runs."""
    www, base = served
    marker = _evil_checkpoint(www, tmp_path)
    with pytest.raises(Exception, match="weights_only") as remote:
        HPUCheckpointIO().load_checkpoint(f"{base}/evil.ckpt")
    assert not marker.exists()
    with pytest.raises(Exception, match="weights_only") as local:
        HPUCheckpointIO().load_checkpoint(www / "evil.ckpt")
    assert not marker.exists()
    assert type(remote.value) is type(local.value)
    assert "Unsupported global" in str(remote.value) and "open" in str(remote.value)


def test_a_plain_checkpoint_url_still_loads(served):
    www, base = served
    torch.save({"w": torch.arange(4.0), "step": 3}, www / "good.ckpt")
    loaded = HPUCheckpointIO().load_checkpoint(f"{base}/good.ckpt", map_location="cpu")
    assert torch.equal(loaded["w"], torch.arange(4.0)) and loaded["step"] == 3


def test_trainer_fit_from_a_checkpoint_url_never_runs_its_pickle(served, tmp_path):
    www, base = served
    marker = _evil_checkpoint(www, tmp_path)
    trainer = L.Trainer(**quiet_trainer_kwargs(accelerator="hpu", max_steps=1, default_root_dir=tmp_path))
    with pytest.raises(Exception, match="weights_only"):
        trainer.fit(LinearModel(4), regression_data(n=8, features=4, batch_size=4), ckpt_path=f"{base}/evil.ckpt")
    assert not marker.exists()


# -- checkpoints that are not files (issue 28, item 7) ----------------------------------------------------------------
def test_a_fifo_named_as_a_checkpoint_is_refused_without_blocking(tmp_path):
    """load_checkpoint on a FIFO blocked for ever (in open, waiting for a writer)."""
    import threading

    fifo = tmp_path / "pipe.ckpt"
    os.mkfifo(fifo)
    outcome: list[BaseException | object] = []

    def load():
        try:
            outcome.append(HPUCheckpointIO().load_checkpoint(fifo))
        except BaseException as err:  # the test inspects it
            outcome.append(err)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(timeout=20)
    if thread.is_alive():  # blocked: give it a writer so the thread ends, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(timeout=10)
        pytest.fail("load_checkpoint blocked on a FIFO")
    (err,) = outcome
    assert isinstance(err, OSError) and "a FIFO (named pipe)" in str(err) and "pipe.ckpt" in str(err)


def test_dev_zero_named_as_a_checkpoint_says_what_it_is():
    """It was called 'empty: its save never completed' (a character device reports size 0)."""
    with pytest.raises(OSError, match="character device") as info:
        HPUCheckpointIO().load_checkpoint("/dev/zero")
    assert "save never completed" not in str(info.value) and "/dev/zero" in str(info.value)


def test_a_file_url_checkpoint_still_loads(tmp_path):
    path = tmp_path / "plain.ckpt"
    torch.save({"w": torch.ones(2)}, path)
    loaded = HPUCheckpointIO().load_checkpoint(f"file://{path}", map_location="cpu")
    assert torch.equal(loaded["w"], torch.ones(2))

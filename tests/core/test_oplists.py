"""Autocast op lists: Habana's files and variables, validation errors that name file/line/op, and their real effect on
dtypes on the emulated Gaudi (a file replaces the default list, the lower list wins), as the bridge applies them."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from hpu_nb.core import oplists
from hpu_nb.core.oplists import OpListError, apply_op_lists, load_op_lists, read_op_file
from hpu_nb.core.precision import hpu_autocast

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_file_format_comments_and_blank_lines(tmp_path) -> None:
    path = write(tmp_path, "ops.txt", "# my ops\nlinear\n\n  matmul   # inline comment\nsoftmax\n")
    entries = read_op_file(path)
    assert [e.op for e in entries] == ["linear", "matmul", "softmax"]
    assert entries[1].origin == f"{path}:4"


def test_missing_file_names_the_argument_and_path(tmp_path) -> None:
    with pytest.raises(OpListError, match=r"fp32_list argument file .*nope\.txt.* does not exist"):
        load_op_lists(fp32=tmp_path / "nope.txt")


def test_binary_file_and_devices_are_clear_errors(tmp_path) -> None:
    binary = tmp_path / "ops.bin"
    binary.write_bytes(b"linear\n\xff\xfe\x00\x81")
    with pytest.raises(OpListError, match=r"ops\.bin' is not a text file of op names \(not UTF-8 text at byte 7\)"):
        load_op_lists(lower=binary)
    with pytest.raises(OpListError, match=r"'/dev/null' is not a regular file \(a device or a pipe\)"):
        load_op_lists(lower="/dev/null")
    fifo = tmp_path / "ops.fifo"
    os.mkfifo(fifo)
    with pytest.raises(OpListError, match="is not a regular file"):  # and does not block reading it
        load_op_lists(fp32=fifo)
    with pytest.raises(OpListError, match="is a directory"):
        load_op_lists(fp32=tmp_path)


@pytest.fixture
def fresh_warnings(monkeypatch):
    """Unknown names are warned about once per process: start each test with none warned yet."""
    monkeypatch.setattr(oplists, "_warned_unknown", set())


def test_unknown_op_names_warn_with_file_line_and_suggestion_and_are_kept(tmp_path, fresh_warnings) -> None:
    """On a Gaudi such a line is never matched; it used to stop the run with OpListError (the plugin's own
    ops_fp32_mnist.txt names 'cross_entropy' and 'tan')."""
    path = write(tmp_path, "bf16.txt", "linear\n\nlinera\n")
    with pytest.warns(oplists.UnknownOpWarning) as seen:
        lists = load_op_lists(lower=path)
    message = " ".join(str(w.message) for w in seen)
    assert f"{path}:3" in message and "'linera'" in message and "'linear'" in message
    assert lists.lower_ops == {"linear", "linera"}


def test_each_unknown_name_is_warned_about_once(fresh_warnings) -> None:
    with pytest.warns(oplists.UnknownOpWarning, match=r"unknown op 'cross_entropy'.*'cross_entropy_loss'"):
        load_op_lists(fp32=["cross_entropy", "cross_entropy"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_op_lists(fp32=["cross_entropy", "_softmax"]).fp32_ops == {"cross_entropy", "_softmax"}


def test_op_lists_name_aten_ops(fresh_warnings) -> None:
    """Habana's lists name ATen ops: a torch.nn.functional-only name is not one (warned), an ATen name is silent."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_op_lists(fp32=["_softmax", "cross_entropy_loss"]).fp32_ops == {"_softmax", "cross_entropy_loss"}


def test_habana_gets_a_normalised_copy_of_a_file_it_would_misread(tmp_path, fresh_warnings) -> None:
    """Habana reads lines verbatim: comments, blank lines, spaces or CRLF would be names that never match, and the
    file replaces the whole default list. A clean file is handed over as it is."""
    clean = write(tmp_path, "clean.txt", "linear\nmatmul\n")
    messy = write(tmp_path, "messy.txt", "# my list\r\n linear \r\n\r\nmatmul  # fast\r\n")
    assert oplists._list_file(load_op_lists(lower=clean).lower, str(clean)) == str(clean)
    copy = oplists._list_file(load_op_lists(lower=messy).lower, str(messy))
    assert copy != str(messy) and Path(copy).read_bytes() == b"linear\nmatmul\n"


def test_malformed_line_is_an_error_with_its_line(tmp_path) -> None:
    path = write(tmp_path, "ops.txt", "linear\nmatmul, softmax\n")
    with pytest.raises(OpListError, match=r"ops\.txt:2: expected one op name per line"):
        read_op_file(path)


def test_op_in_both_lists_names_both_places(tmp_path) -> None:
    lower = write(tmp_path, "lower.txt", "relu\nlinear\n")
    fp32 = write(tmp_path, "fp32.txt", "softmax\nlinear\n")
    with pytest.raises(OpListError) as info:
        load_op_lists(lower=lower, fp32=fp32)
    assert f"{lower}:2" in str(info.value) and f"{fp32}:2" in str(info.value) and "'linear'" in str(info.value)
    with pytest.raises(OpListError, match=r"fp32_list argument \[1\]"):
        load_op_lists(fp32=["linear", ""])


def test_a_list_replaces_the_default_list_and_the_lower_list_wins() -> None:
    """As Habana's bridge: the fp32 file replaces the default fp32 list; linear is still in the default lower list,
    which is checked first, so it stays bf16 until the lower list is replaced too."""
    layer, x = torch.nn.Linear(8, 8).to("hpu"), torch.randn(4, 8, device="hpu")
    with hpu_autocast(torch.bfloat16):
        assert layer(x).dtype == torch.bfloat16 and torch.exp(x).dtype == torch.float32
    in_force, note = apply_op_lists(load_op_lists(fp32=["linear"]))
    assert in_force and "a Gaudi reads them only when Habana's software loads" in note
    with hpu_autocast(torch.bfloat16):
        assert layer(x).dtype == torch.bfloat16  # the default lower list still names linear
        assert torch.exp(x).dtype == torch.float32 and (x / 2).dtype == torch.float32  # exp / div: not in fp32 any more
    apply_op_lists(load_op_lists(lower=["exp"], fp32=["linear"]))
    with hpu_autocast(torch.bfloat16):
        out = layer(x)
        assert out.dtype == torch.float32 and torch.exp(x).dtype == torch.bfloat16
        assert (x @ x.T).dtype == torch.float32  # mm is no longer in the (replaced) lower list
    assert torch.allclose(out, layer(x), atol=1e-6)  # really computed in fp32, not rounded through bf16


def test_lists_act_only_while_autocast_is_enabled() -> None:
    apply_op_lists(load_op_lists(lower=["exp"]))
    x = torch.randn(4, 16, device="hpu")
    with hpu_autocast(torch.bfloat16):
        with torch.autocast("hpu", enabled=False):
            assert torch.exp(x).dtype == torch.float32
        assert torch.exp(x).dtype == torch.bfloat16
    assert torch.exp(x).dtype == torch.float32


def test_applying_sets_the_variables_the_release_reads_for_worker_processes(tmp_path) -> None:
    apply_op_lists(load_op_lists(lower=["exp"], fp32=write(tmp_path, "f.txt", "linear\n")))
    assert os.environ["PT_HPU_AUTOCAST_FP32_OPS_LIST"] == str(tmp_path / "f.txt")
    written = Path(os.environ["PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST"])
    assert written.read_text() == "exp\n"  # names are written to a file a new process can read
    code = ("import torch, hpu_nb; from hpu_nb.runtime import get_backend; get_backend()\n"
            "x = torch.randn(2, 4, device='hpu')\nwith torch.autocast('hpu', dtype=torch.bfloat16):\n"
            "    print(x.exp().dtype, torch.nn.Linear(4, 4).to('hpu')(x).dtype)")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["torch.bfloat16", "torch.float32"]


def test_gradients_flow_through_listed_ops() -> None:
    layer, x = torch.nn.Linear(8, 8).to("hpu"), torch.randn(4, 8, device="hpu")
    apply_op_lists(load_op_lists(lower=["mm"], fp32=["linear"]))
    with hpu_autocast(torch.bfloat16):
        loss = layer(x).sum()
    loss.backward()  # outside autocast, as Lightning does
    assert layer.weight.grad is not None and layer.weight.grad.dtype == torch.float32
    assert torch.allclose(layer.weight.grad.cpu(), x.sum(0).expand(8, 8).cpu(), atol=1e-5)


def test_lower_list_alone_under_its_old_name_warns_once_naming_the_new_variable(tmp_path) -> None:
    ops = write(tmp_path, "ops.txt", "exp\n")
    code = ("import warnings, torch, lightning as L, hpu_nb\nfrom hpu_nb import HPUPrecisionPlugin\n"
            "from tests.helpers.models import LinearModel, regression_data, quiet_trainer_kwargs\n"
            "for _ in range(2):\n"
            "    t = L.Trainer(**quiet_trainer_kwargs(accelerator='hpu', devices=1, max_steps=1),\n"
            "                  precision='bf16-mixed')\n"
            "    t.fit(LinearModel(8), regression_data(n=8, features=8))\n"
            "x = torch.randn(2, 2, device='hpu')\nwith torch.autocast('hpu', dtype=torch.bfloat16):\n"
            "    print('exp:', x.exp().dtype)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PT_HPU_AUTOCAST")}
    env.update(PYTHONPATH=str(ROOT), LOWER_LIST=str(ops), PYTHONWARNINGS="default")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    warned = [line for line in done.stderr.splitlines() if "LOWER_LIST is not read" in line]
    assert len(warned) == 1 and "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST" in warned[0]
    assert "exp: torch.float32" in done.stdout  # not applied, as on a Gaudi 1.19+

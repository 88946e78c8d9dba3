"""Autocast op lists: file parsing, validation errors that name file/line/op, and their real effect on dtypes."""

from __future__ import annotations

import pytest
import torch

from hpu_nb.core.oplists import OpListError, OpListMode, load_op_lists, op_name, read_op_file
from hpu_nb.core.precision import hpu_autocast


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_file_format_comments_and_blank_lines(tmp_path) -> None:
    path = write(tmp_path, "ops.txt", "# my ops\nlinear\n\n  matmul   # inline comment\nsoftmax\n")
    entries = read_op_file(path)
    assert [e.op for e in entries] == ["linear", "matmul", "softmax"]
    assert entries[1].origin == f"{path}:4"


def test_missing_file_names_the_variable_and_path(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FP32_LIST", str(tmp_path / "nope.txt"))
    with pytest.raises(OpListError, match=r"FP32_LIST file .*nope\.txt.* does not exist"):
        load_op_lists()


def test_unknown_op_names_file_line_op_and_suggests(tmp_path) -> None:
    path = write(tmp_path, "bf16.txt", "linear\n\nlinera\n")
    with pytest.raises(OpListError) as info:
        load_op_lists(lower=path)
    message = str(info.value)
    assert f"{path}:3" in message and "'linera'" in message and "'linear'" in message


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


def test_lists_from_environment_and_argument_override(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LOWER_LIST", str(write(tmp_path, "l.txt", "softmax\n")))
    monkeypatch.setenv("FP32_LIST", str(write(tmp_path, "f.txt", "linear\n")))
    env = load_op_lists()
    assert env.lower_ops == {"softmax"} and env.fp32_ops == {"linear"} and env.from_env
    mixed = load_op_lists(fp32=["matmul"])
    assert mixed.lower_ops == {"softmax"} and mixed.fp32_ops == {"matmul"} and not mixed.from_env
    with pytest.raises(OpListError, match=r"fp32_list argument \[1\]"):
        load_op_lists(fp32=["linear", ""])


def test_aten_only_op_is_accepted_with_a_note() -> None:
    lists = load_op_lists(fp32=["_softmax"])
    assert lists.fp32_ops == {"_softmax"}
    assert any("'_softmax'" in note for note in lists.notes)


def test_op_names_of_torch_functions() -> None:
    assert op_name(torch.nn.functional.linear) == "linear"
    assert op_name(torch.Tensor.__matmul__) == "matmul"
    assert op_name(torch.nn.functional.softmax) == "softmax"


def test_fp32_list_keeps_linear_in_float32_under_autocast() -> None:
    layer, x = torch.nn.Linear(8, 8).to("hpu"), torch.randn(4, 8, device="hpu")
    with hpu_autocast(torch.bfloat16):
        assert layer(x).dtype == torch.bfloat16
    with hpu_autocast(torch.bfloat16, op_lists=load_op_lists(fp32=["linear"])):
        out = layer(x)
        assert out.dtype == torch.float32
        assert (x @ x.T).dtype == torch.bfloat16  # matmul is not listed: still lowered
    assert torch.allclose(out, layer(x), atol=1e-6)  # really computed in fp32, not rounded through bf16


def test_lower_list_runs_an_op_in_bf16_that_habanas_default_keeps_in_fp32() -> None:
    x = torch.randn(4, 16, device="hpu")
    with hpu_autocast(torch.bfloat16):
        assert torch.exp(x).dtype == torch.float32
    with hpu_autocast(torch.bfloat16, op_lists=load_op_lists(lower=["exp"])) as _:
        assert torch.exp(x).dtype == torch.bfloat16
        assert x.exp().dtype == torch.bfloat16


def test_lists_act_only_while_autocast_is_enabled() -> None:
    lists = load_op_lists(lower=["exp"])
    x = torch.randn(4, 16, device="hpu")
    with hpu_autocast(torch.bfloat16, op_lists=lists):
        with torch.autocast("hpu", enabled=False):
            assert torch.exp(x).dtype == torch.float32
    with OpListMode(lists, "hpu") as mode:  # a mode without autocast changes nothing
        assert torch.exp(x).dtype == torch.float32
    assert mode.applied == {}


def test_gradients_flow_through_forced_ops() -> None:
    layer, x = torch.nn.Linear(8, 8).to("hpu"), torch.randn(4, 8, device="hpu")
    with hpu_autocast(torch.bfloat16, op_lists=load_op_lists(fp32=["linear"])):
        loss = layer(x).sum()
    loss.backward()  # outside autocast, as Lightning does
    assert layer.weight.grad is not None and layer.weight.grad.dtype == torch.float32
    assert torch.allclose(layer.weight.grad.cpu(), x.sum(0).expand(8, 8).cpu(), atol=1e-5)

"""A notebook cell that would make DeepSpeed compile an op says so first, with the expected time."""

from __future__ import annotations

import pytest

pytest.importorskip("deepspeed")

from hpu_nb.notebook.deepspeed_ops import announce_compilation  # noqa: E402


def test_announces_only_the_ops_not_built(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    both = ("ShareMemCommBuilder", "CPUAdamBuilder")
    assert announce_compilation(both) == list(both)
    out = capsys.readouterr().out
    assert "compiles the CPU communication op and DeepSpeedCPUAdam (ZeRO-Offload) first: about 4 minutes" in out
    assert str(tmp_path) in out
    built = next(tmp_path.glob("*"), None) or tmp_path / "deepspeed_shm_comm"
    built.mkdir(exist_ok=True)
    (built / "deepspeed_shm_comm.so").write_bytes(b"")
    assert announce_compilation(both) == ["CPUAdamBuilder"]
    assert "DeepSpeedCPUAdam (ZeRO-Offload) first: about 2 minutes" in capsys.readouterr().out

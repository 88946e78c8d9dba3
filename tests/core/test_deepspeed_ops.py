"""A notebook cell that would make DeepSpeed compile an op says so first, with the expected time."""

from __future__ import annotations

import pytest

pytest.importorskip("deepspeed")

from hpu_nb.notebook.deepspeed_ops import announce_compilation


def test_announces_only_the_ops_not_built(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    # DeepSpeed's HPU accelerator has no shared-memory communication op (HCCL communicates): nothing to announce
    assert announce_compilation(("ShareMemCommBuilder",)) == []
    assert capsys.readouterr().out == ""
    assert announce_compilation() == ["CPUAdamBuilder"]
    out = capsys.readouterr().out
    assert "compiles DeepSpeedCPUAdam (ZeRO-Offload) first: about 2 minutes" in out and str(tmp_path) in out
    built = tmp_path / "cpu_adam"
    built.mkdir(exist_ok=True)
    (built / "cpu_adam.so").write_bytes(b"")
    assert announce_compilation() == []
    assert capsys.readouterr().out == ""

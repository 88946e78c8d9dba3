"""A notebook cell that would make DeepSpeed compile an op says so first, with the expected time; an op is "built" only
when ninja (the one a load runs) has nothing left to do in its folder."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("deepspeed")

from hpu_nb.notebook.deepspeed_ops import announce_compilation
from hpu_nb.runtime.distributed import use_environments_ninja


def test_announces_only_the_ops_not_built(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    # DeepSpeed's HPU accelerator has no shared-memory communication op (HCCL communicates): nothing to announce
    assert announce_compilation(("ShareMemCommBuilder",)) == []
    assert capsys.readouterr().out == ""
    assert announce_compilation() == ["CPUAdamBuilder"]
    out = capsys.readouterr().out
    assert "compiles DeepSpeedCPUAdam (ZeRO-Offload) first: about 2-5 minutes per op" in out and str(tmp_path) in out
    built = tmp_path / "cpu_adam"
    built.mkdir(exist_ok=True)
    (built / "cpu_adam.so").write_bytes(b"")
    assert announce_compilation() == ["CPUAdamBuilder"]  # a library alone is not a build: ninja would run again
    capsys.readouterr()
    # a folder where ninja has nothing to do: an up-to-date output of a rule that made it
    (built / "build.ninja").write_text("rule touch\n  command = touch $out\nbuild cpu_adam.so: touch\n")
    subprocess.run(["ninja", "-C", str(built)], check=True, capture_output=True)
    assert announce_compilation() == []
    assert capsys.readouterr().out == ""


def test_the_environments_ninja_comes_first_on_path(monkeypatch) -> None:
    """The build at set-up and the load at fit time run the same ninja: this environment's (issue 39)."""
    bin_dir = os.path.dirname(sys.executable)
    if not os.path.isfile(os.path.join(bin_dir, "ninja")):
        pytest.skip("no ninja in this environment's bin")
    monkeypatch.setenv("PATH", os.pathsep.join(["/usr/bin", bin_dir, "/bin"]))
    use_environments_ninja()
    assert os.environ["PATH"].split(os.pathsep) == [bin_dir, "/usr/bin", "/bin"]
    use_environments_ninja()  # idempotent
    assert os.environ["PATH"].split(os.pathsep) == [bin_dir, "/usr/bin", "/bin"]

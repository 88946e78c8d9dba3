"""DeepSpeed's CPU Adam op built ahead (`python -m hpu_nb.core.strategies.deepspeed_ops`, as `make setup` runs it) is
the one a fit loads: no compiler runs at fit time (issue 39: `make setup` ran the system's ninja, a notebook kernel
pip's newer one, which discarded the older `.ninja_log` and compiled for minutes, mid-fit). A build that is still
needed at fit time is said first, and interrupting it leaves one line and keeps the objects already compiled."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = os.path.dirname(sys.executable)

INTERRUPTED_FIT = """
from hpu_nb.core.strategies.deepspeed_ops import build_announced
from hpu_nb.core.strategy_parts.interrupts import FitInterrupted
try:
    build_announced()
except FitInterrupted as stopped:
    print("ONE LINE:", stopped, flush=True)
"""


def _env(ext: Path, path_first: str | None) -> dict[str, str]:
    """A process as `make setup` starts it (the system's bin first on PATH) or as a notebook kernel does (the
    environment's bin first: its kernel spec says so)."""
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext), "PYTHONPATH": str(ROOT), "MAX_JOBS": "1"}
    rest = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != VENV_BIN]
    env["PATH"] = os.pathsep.join(([path_first] if path_first else []) + rest + [VENV_BIN])
    return env


def _state(folder: Path) -> dict[str, int]:
    kept = (".o", ".so")
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir() if p.suffix in kept or p.name == ".ninja_log"}


def _working_in(folder: Path) -> list[str]:
    """The processes whose working directory is `folder` (ninja runs its compilers there)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if Path(os.readlink(entry / "cwd")) == folder:
                found.append((entry / "cmdline").read_text().replace("\0", " ")[:80])
        except OSError:
            continue
    return found


def _logged_objects(folder: Path) -> set[str]:
    """The objects ninja logged as finished (it logs each command when it ends)."""
    log = folder / ".ninja_log"
    lines = log.read_text().splitlines()[1:] if log.is_file() else []
    return {line.split("\t")[3] for line in lines if line.count("\t") >= 4 and line.split("\t")[3].endswith(".o")}


@pytest.mark.timeout(1500)
def test_the_op_built_ahead_is_loaded_without_compiling_and_an_interrupted_build_keeps_its_objects(tmp_path):
    ext = tmp_path / "ext"
    system_bin = os.path.dirname(shutil.which("ninja", path="/usr/bin:/bin") or "") or None  # make's PATH
    folder = ext / "cpu_adam"

    # a fit that finds nothing built: it says what it compiles and for how long, then the user interrupts it once
    # the first object is done (one compiler at a time: MAX_JOBS=1)
    fit = subprocess.Popen([sys.executable, "-c", INTERRUPTED_FIT], env=_env(ext, system_bin), text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 900
    while not _logged_objects(folder) and time.monotonic() < deadline and fit.poll() is None:
        time.sleep(1)
    finished = _logged_objects(folder)
    assert finished, "no object compiled"
    fit.send_signal(signal.SIGINT)
    out, _ = fit.communicate(timeout=120)
    assert "DeepSpeed compiles DeepSpeedCPUAdam (ZeRO-Offload) before this fit: about 2-5 minutes per op" in out, out
    assert "ONE LINE: Stopped by you while DeepSpeed compiled DeepSpeedCPUAdam" in out, out
    assert "Traceback" not in out and "Error" not in out, out
    assert not _working_in(folder), "a compiler outlived the interrupt"
    assert {p.name for p in folder.glob("*.o")} >= finished  # the finished object is kept ...
    ninja = shutil.which("ninja", path=VENV_BIN)
    remaining = subprocess.run([ninja, "-n", "-C", str(folder)], capture_output=True, text=True, check=True).stdout
    assert remaining.count("c++ ") == 2, remaining  # ... and not compiled again: one object left, and the link

    # `make setup`'s build (the system's ninja first on PATH), then a kernel's load (the environment's first): under
    # `make test` the one setup made (TORCH_EXTENSIONS_DIR, exported by make); run alone, one made here as setup does
    setup_ext = Path(os.environ.get("TORCH_EXTENSIONS_DIR", ext))
    if not (setup_ext / "cpu_adam" / "cpu_adam.so").is_file():
        setup_ext = ext
        subprocess.run([sys.executable, "-m", "hpu_nb.core.strategies.deepspeed_ops"], env=_env(ext, system_bin),
                       check=True, timeout=900)
    folder = setup_ext / "cpu_adam"
    built = _state(folder)
    assert {"cpu_adam.so", ".ninja_log"} <= built.keys()
    check = ("from hpu_nb.core.strategies.deepspeed_ops import pending_builds, build_ops\n"
             "print('PENDING', pending_builds()); build_ops(); print('LOADED')")
    run = subprocess.run([sys.executable, "-c", check], env=_env(setup_ext, VENV_BIN), capture_output=True, text=True,
                         timeout=900, check=True)
    assert "PENDING []" in run.stdout and "LOADED" in run.stdout, run.stdout + run.stderr
    assert _state(folder) == built  # nothing compiled, linked or relogged at fit time

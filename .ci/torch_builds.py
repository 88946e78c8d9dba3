"""Run the emulated Gaudi's checks on other builds of torch than the pinned CPU one: what `make test-torch-builds` does.

    python .ci/torch_builds.py [SPEC ...] [-- PYTEST ARGS]    SPEC: a torch release (2.9.1) or "latest" (PyPI's newest)

For each SPEC: an environment with that torch as pip gives it on Linux (a CUDA build, as a user's plain
`pip install torch` does), hpu_nb installed into it *non-editable* from a wheel of this checkout (with the dev and
deepspeed extras), the emulated device built for that torch; then, from the checkout, the fast suite (`-m "not browser
and not slow"`) and tests/runtime/test_torch_builds.py (one card, bf16, torch.compile, two cards over HCCL, a notebook
cell, Lightning's plain Trainer unchanged). One summary line per torch at the end; exit 1 if any failed.

Environments are cached between runs in $HPU_NB_TORCH_BUILDS_DIR (default ~/.cache/hpu_nb/torch-builds), one per
SPEC and Python: torch and its CUDA libraries (several GB) are installed once; "latest" is re-checked against PyPI on
every run; hpu_nb is reinstalled from the checkout every run. pip's own cache keeps the downloads; the emulated
device's library is cached per torch in hpu_nb's cache directory.

The machine's pip may cap torch with a constraints file (PIP_CONSTRAINT / pip.conf): a release above the cap is
installed with PIP_CONSTRAINT=/dev/null for pip's commands in that environment only, and every install there pins
torch to the one installed, so nothing replaces it. Standard library only.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SPECS = ("2.14.1", "latest")
EXTRAS = "dev,deepspeed"
SELECTION = ["tests", "-m", "(not browser and not slow) or torch_builds"]
STAMP = ".torch-builds-ready"


def cache_root() -> Path:
    explicit = os.environ.get("HPU_NB_TORCH_BUILDS_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hpu_nb" / "torch-builds"


def check_spec(spec: str) -> str:
    if spec != "latest" and not re.fullmatch(r"\d+\.\d+(\.\d+)?", spec):
        raise SystemExit(f"torch_builds: {spec!r} is neither a torch release (2.14.1) nor 'latest'")
    return spec


def say(message: str) -> None:
    print(f"torch_builds: {message}", flush=True)


def run(command: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
    subprocess.run(command, check=True, env=env, cwd=cwd)


def uncapped_pip_env() -> dict[str, str]:
    """pip's environment without the machine's torch cap (pip 26 ignores an empty PIP_CONSTRAINT: /dev/null it is)."""
    return {**os.environ, "PIP_CONSTRAINT": "/dev/null", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def torch_version(python: Path) -> str | None:
    result = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"],
                            capture_output=True, text=True, check=False, env={**os.environ, "HPU_NB_AUTOLOAD": "0"})
    return result.stdout.strip() if result.returncode == 0 else None


def environment_for(spec: str) -> Path:
    """The cached environment holding torch SPEC (created, or brought up to date for "latest")."""
    target = cache_root() / f"torch-{spec}-py{sys.version_info.major}.{sys.version_info.minor}"
    python = target / "bin" / "python"
    if not (target / STAMP).exists():
        if target.exists():
            shutil.rmtree(target)  # a half-made environment from an interrupted run is not reused
        say(f"creating {target} (torch and its CUDA libraries: a few GB the first time)")
        venv.EnvBuilder(with_pip=True).create(target)
        run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], env=uncapped_pip_env())
    requirement = "torch" if spec == "latest" else f"torch=={spec}"
    upgrade = ["--upgrade"] if spec == "latest" else []
    run([str(python), "-m", "pip", "install", "-q", *upgrade, requirement], env=uncapped_pip_env())
    (target / STAMP).touch()
    return target


def checkout_wheel(directory: Path) -> Path:
    """One wheel of this checkout, installed into every environment (non-editable, as users install it)."""
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(directory),
         str(ROOT)], env=uncapped_pip_env())
    (wheel,) = directory.glob("hpu_nb-*.whl")
    return wheel


def install_hpu_nb(target: Path, wheel: Path) -> str:
    """hpu_nb and its extras into `target`, torch pinned to the one there; returns that torch's version."""
    python = target / "bin" / "python"
    installed = torch_version(python)
    if installed is None:
        raise SystemExit(f"torch_builds: torch does not import in {target}")
    constraints = target / "constraints.txt"
    constraints.write_text(f"torch=={installed.split('+')[0]}\n")
    env = uncapped_pip_env()
    run([str(python), "-m", "pip", "install", "-q", "-c", str(constraints), f"{wheel}[{EXTRAS}]"], env=env)
    run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)], env=env)
    after = torch_version(python)
    if after != installed:
        raise SystemExit(f"torch_builds: installing hpu_nb replaced torch {installed} with {after} in {target}")
    run([str(python), "-m", "hpu_nb.emulator.hpu_device"])  # once per torch: cached in hpu_nb's cache directory
    return installed


def test(target: Path, pytest_args: list[str]) -> int:
    python = target / "bin" / "python"
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["PATH"] = f"{target / 'bin'}{os.pathsep}{env.get('PATH', '')}"  # kernels and tools of this environment
    env["TORCH_EXTENSIONS_DIR"] = str(target / "torch_extensions")  # DeepSpeed's ops, built for this torch
    command = [str(python), "-m", "pytest", *SELECTION, "-q", "-p", "no:cacheprovider", *pytest_args]
    return subprocess.run(command, env=env, cwd=ROOT, check=False).returncode


def main(argv: list[str]) -> int:
    split = argv.index("--") if "--" in argv else len(argv)
    specs = [check_spec(spec) for spec in argv[:split]] or list(DEFAULT_SPECS)
    pytest_args = argv[split + 1:]
    results: list[tuple[str, str, int, float]] = []
    with tempfile.TemporaryDirectory(prefix="hpu_nb-wheel-") as tmp:
        wheel = checkout_wheel(Path(tmp))
        for spec in specs:
            started = time.monotonic()
            target = environment_for(spec)
            version = install_hpu_nb(target, wheel)
            say(f"torch {version} ({spec}) in {target}: running the fast suite and tests/runtime/test_torch_builds.py")
            code = test(target, pytest_args)
            results.append((spec, version, code, time.monotonic() - started))
    for spec, version, code, seconds in results:
        say(f"torch {version} ({spec}): {'passed' if code == 0 else f'FAILED (pytest exit {code})'} in {seconds:.0f} s")
    return 0 if all(code == 0 for _, _, code, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

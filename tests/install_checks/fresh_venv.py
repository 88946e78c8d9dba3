"""Build hpu_nb's sdist and wheel from the checkout's tracked files, and install the wheel into a fresh venv.

The venv gets the wheel alone (`pip install --no-deps`, not editable); its other packages (torch, Lightning,
DeepSpeed, Jupyter...) come from the checkout's .venv through a `.pth` line that Python appends to sys.path *after*
the new venv's own site-packages. Only that directory is added, so .venv's `.pth` files (hpu_nb's editable finder,
its `hpu_nb-habana.pth`) are not run there: hpu_nb, `_hpu_nb_autoload`, `_hpu_nb_habana_finder` and hpu_nb's entry
points come from the wheel (importlib.metadata keeps the first distribution of a name on sys.path).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEPS_PTH = "zz_hpu_nb_test_deps.pth"  # sorted last among the venv's .pth files


def copy_tracked_files(dest: Path) -> Path:
    """The checkout's files as a clone of it would have them: tracked and not-ignored ones, as in the working tree
    (what the editable install in .venv runs; in CI that is the commit)."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           check=True, capture_output=True).stdout
    for name in names.decode().split("\0"):
        if name and (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    return dest


def build_sdist_and_wheel(source: Path, dist: Path) -> tuple[Path, Path]:
    """The sdist (PEP 517's build_sdist), then the wheel built from that sdist, as `python -m build` does."""
    dist.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-c", f"from setuptools import build_meta; build_meta.build_sdist({str(dist)!r})"],
                   cwd=source, check=True, capture_output=True)
    (sdist,) = dist.glob("hpu_nb-*.tar.gz")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist),
                    str(sdist)], cwd=dist, check=True, capture_output=True)
    (wheel,) = dist.glob("hpu_nb-*.whl")
    return sdist, wheel


def make_venv(venv: Path, wheel: Path) -> Path:
    """A new venv holding the wheel, the checkout's .venv packages behind it; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True, capture_output=True)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / DEPS_PTH).write_text(sysconfig.get_path("purelib") + "\n")
    return python


def venv_env(venv: Path, **extra: str) -> dict[str, str]:
    """The environment a user of the venv has: its bin first, no PYTHONPATH, no hpu_nb settings, own Jupyter dirs."""
    dropped = ("PYTHONPATH", "VIRTUAL_ENV", "TORCH_EXTENSIONS_DIR")
    env = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith(("HPU_NB_", "JUPYTER"))}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv), PYTHONNOUSERSITE="1",
               JUPYTER_PREFER_ENV_PATH="1", JUPYTER_DATA_DIR=str(venv / "jupyter-user-data"),
               JUPYTER_CONFIG_DIR=str(venv / "jupyter-user-config"))
    env.update(extra)
    return env

"""Set up a virtual environment layered on another one and install an extra of hpu_nb into it, changing nothing below.

    python .ci/layered_venv.py BASE_PYTHON TARGET_DIR EXTRA

What `make test` runs to give optimum-habana its own environment, `.venv-optimum`, over `.venv`: its tests need
transformers, and with transformers installed every Lightning process pays for it at start-up (torchmetrics, which
Lightning imports, then imports transformers: ~2 s of CPU each, in hundreds of processes per test run). The layered
environment sees everything of the base (torch, Lightning, hpu_nb, its `habana_frameworks`) through a `.pth` file,
and pip installs only what the extra adds, under a constraints file that pins every package of the base to its
installed version: torch (Habana's on a Gaudi, the CPU build elsewhere) is never replaced. The extra's requirements
come from hpu_nb's metadata as installed in the base (pyproject.toml, their one home). Standard library only.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path


def base_site_dirs(base_python: str) -> list[str]:
    """The base environment's site-packages directories (with Habana's system ones, for a --system-site-packages venv
    on a Gaudi)."""
    out = subprocess.run([base_python, "-c", "import site; print('\\n'.join(site.getsitepackages()))"],
                         capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line]


def base_constraints(base_python: str) -> str:
    """name==version for every distribution of the base (pip's freeze format, never a direct URL)."""
    return subprocess.run([base_python, "-m", "pip", "list", "--format=freeze", "--exclude-editable"],
                          capture_output=True, text=True, check=True).stdout


def extra_requirements(base_python: str, extra: str) -> list[str]:
    """The extra's requirements, from hpu_nb's installed metadata (`Requires-Dist: ...; extra == "optimum"`)."""
    ask = "import importlib.metadata as m, json; print(json.dumps(m.requires('hpu_nb')))"
    out = subprocess.run([base_python, "-c", ask], capture_output=True, text=True, check=True).stdout
    marker = re.compile(rf"""extra\s*==\s*['"]{re.escape(extra)}['"]""")
    found = [r.split(";")[0].strip() for r in json.loads(out) or [] if marker.search(r)]
    if not found:
        raise SystemExit(f"layered_venv: hpu_nb installed in {base_python} has no extra {extra!r}")
    return found


def create_layer(base_python: str, target: Path) -> Path:
    """A new venv at `target` that sees `base_python`'s packages, with `target/constraints.txt` pinning every one of
    them; returns its python. Also used by tools/ (the tutorials and lightning-habana runners' layers)."""
    if target.exists():
        shutil.rmtree(target)  # a half-made environment from an interrupted run is not reused
    venv.EnvBuilder(with_pip=True).create(target)
    python = target / "bin" / "python"
    own_site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
    # Lines of a .pth file that start with `import` run at start-up: addsitedir also reads the base's own .pth files
    # (hpu_nb's editable finder, its habana_frameworks autoload). The layer's own packages come first on sys.path.
    lines = [f"import site; site.addsitedir({d!r})" for d in base_site_dirs(base_python)]
    (Path(own_site) / "_hpu_nb_base_environment.pth").write_text("\n".join(lines) + "\n")
    (target / "constraints.txt").write_text(base_constraints(base_python))
    return python


def main(base_python: str, target: Path, extra: str) -> None:
    python = create_layer(base_python, target)
    requirements = extra_requirements(base_python, extra)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "-c", str(target / "constraints.txt"), *requirements],
                   check=True)

if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3])

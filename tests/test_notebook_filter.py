"""notebooks/ reach git without outputs (issue 39, item 7): `make notebook-filter` (part of `make setup`) defines the
nbstripout filter that .gitattributes names. In a clone: a tutorial run and saved with outputs stages as committed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("nbstripout")
ROOT = Path(__file__).resolve().parents[1]
VENV = Path(sys.executable).parent.parent


def _git(clone: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=clone, capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_a_run_and_saved_tutorial_stages_without_its_outputs(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    for name in ("Makefile", ".gitattributes", *(str(p.relative_to(ROOT)) for p in ROOT.glob("notebooks/*.ipynb"))):
        shutil.copy(ROOT / name, clone / name)  # this tree's, committed or not
    subprocess.run(["make", "-s", "notebook-filter", f"VENV={VENV}"], cwd=clone, check=True)
    assert "--keep-id" in _git(clone, "config", "filter.nbstripout.clean")
    _git(clone, "add", "Makefile", ".gitattributes", "notebooks")
    _git(clone, "-c", "user.name=t", "-c", "user.email=t@localhost", "commit", "-qm", "this tree", "--allow-empty")
    assert _git(clone, "status", "--porcelain") == ""  # the tutorials as they are are already stripped

    path = clone / "notebooks" / "01_getting_started.ipynb"
    nb = json.loads(path.read_text())
    code = next(cell for cell in nb["cells"] if cell["cell_type"] == "code")
    code["execution_count"] = 3
    code["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["trained\n"]}]
    nb["metadata"]["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    path.write_text(json.dumps(nb, indent=1))
    _git(clone, "add", "notebooks")
    assert _git(clone, "diff", "--cached", "--stat") == ""  # staged as committed: no outputs, counts or widget state
    assert "trained" not in _git(clone, "diff")  # git diff shows the notebook without its outputs too

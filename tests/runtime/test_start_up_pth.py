"""The start-up line of `hpu_nb-habana.pth`, run as Python runs it: by `site` from a site folder.

A `.pth` outlives its modules when hpu_nb goes without pip (a deleted editable checkout, a copied site-packages);
Python runs its line at every start, in every program. Each test runs `python -I -S` (no site-packages, no PYTHONPATH,
no checkout on the path) and hands a temporary site folder holding the repository's `.pth` to `site.addsitedir`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PTH = REPO / "hpu_nb-habana.pth"
FINDER = REPO / "_hpu_nb_habana_finder.py"


def _start_python_with_site(site_dir: Path, code: str = "") -> subprocess.CompletedProcess:
    program = f"import site, sys; site.addsitedir({str(site_dir)!r}); {code}"
    return subprocess.run([sys.executable, "-I", "-S", "-c", program], cwd=site_dir, capture_output=True, text=True,
                          timeout=120, check=False)


def test_a_left_over_pth_whose_finder_is_gone_starts_python_silently(tmp_path):
    shutil.copy(PTH, tmp_path)
    result = _start_python_with_site(tmp_path, "print('started')")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "started"
    assert result.stderr == ""  # was "Error processing line 1 of ...", a traceback and "Remainder of file ignored"


def test_the_pth_appends_the_finder_where_its_module_is_present(tmp_path):
    shutil.copy(PTH, tmp_path)
    shutil.copy(FINDER, tmp_path)
    result = _start_python_with_site(tmp_path, "print([type(f).__name__ for f in sys.meta_path][-1])")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "HabanaFallbackFinder" and result.stderr == ""


def test_a_finder_that_is_present_but_broken_is_still_reported(tmp_path):
    """Only the finder's own absence is silent: an error inside it (a missing module it needs) stays visible."""
    shutil.copy(PTH, tmp_path)
    (tmp_path / FINDER.name).write_text("import hpu_nb_module_that_is_not_there\n")
    result = _start_python_with_site(tmp_path, "print('started')")
    assert "hpu_nb_module_that_is_not_there" in result.stderr

"""The interpreters of the environments `make test` layers over `.venv` (.ci/layered_venv.py): `.venv-optimum`
(HPU_NB_OPTIMUM_PYTHON) and `.venv-transformers` (HPU_NB_TRANSFORMERS_PYTHON), and what is installed in them."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path


def layer_python(variable: str) -> str:
    """The interpreter `variable` names where it exists, else this one."""
    named = os.environ.get(variable)
    return named if named and Path(named).is_file() else sys.executable


@functools.cache
def installed_versions(python: str, names: tuple[str, ...]) -> dict[str, str | None]:
    """The distributions' versions in `python`'s environment (None: not installed)."""
    ask = ("import importlib.metadata as m, json, sys\n"
           "def version(name):\n"
           "    try:\n"
           "        return m.version(name)\n"
           "    except m.PackageNotFoundError:\n"
           "        return None\n"
           "print(json.dumps({name: version(name) for name in sys.argv[1:]}))")
    done = subprocess.run([python, "-c", ask, *names], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout)

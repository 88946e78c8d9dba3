"""Run in the fresh venv: execute notebooks with nbclient on this venv's `python3` kernel; print their outputs (JSON).

    python run_notebooks.py WORKDIR NOTEBOOK...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

workdir, notebooks = Path(sys.argv[1]), sys.argv[2:]
texts = {}
for path in notebooks:
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, kernel_name="python3", timeout=600, resources={"metadata": {"path": str(workdir)}}).execute()
    outputs = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            outputs.append(output.get("text") or "".join(str(v) for v in output.get("data", {}).values()))
    texts[Path(path).name] = "\n".join(outputs)
print(json.dumps(texts))

"""The tutorials say what their cells print: each notebook is executed once per session (nbclient) and the values
their text names are read from the outputs (InUse after fit, the op-list table, autocast dtypes, fp8 vs bf16, the
chart's button label, the snapshots a saved notebook keeps)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import nbformat
import pytest

from tests.helpers.notebook_runs import EXECUTED

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"


# A cell that runs longer than this fails naming itself (nbclient's CellTimeoutError shows its source), before
# pytest-timeout's 300 s would stop the whole test with only the client's stack (`make test` gives nbmake's runs, which
# these tests read, the same bound: --nbmake-timeout=200).
CELL_TIMEOUT_S = 200


class Executed:
    """One executed tutorial: cell sources and their outputs as text (stdout, stderr, text/plain, text/html)."""

    def __init__(self, nb: nbformat.NotebookNode) -> None:
        self.nb = nb

    def source(self, index: int) -> str:
        return self.nb.cells[index].source

    def out(self, index: int, kind: str = "stdout") -> str:
        parts = []
        for o in self.nb.cells[index].get("outputs", []):
            if o.output_type == "stream" and o.name == kind:
                parts.append(o.text)
            elif kind in o.get("data", {}):
                parts.append(o.data[kind])
        return "".join(parts)

    def cell(self, marker: str) -> int:
        """Index of the first code cell whose source contains `marker`."""
        return next(i for i, c in enumerate(self.nb.cells) if c.cell_type == "code" and marker in c.source)

    def markdown(self) -> str:
        return "\n".join(c.source for c in self.nb.cells if c.cell_type == "markdown")


_cache: dict[str, Executed] = {}


def executed(name: str) -> Executed:
    """A tutorial executed once per session: the run nbmake made (tests/helpers/notebook_runs.py), else executed here
    (in a copy, from the notebooks folder, as a user would)."""
    if name not in _cache and name in EXECUTED:
        _cache[name] = Executed(EXECUTED[name])
    if name not in _cache:
        from nbclient import NotebookClient

        nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
        env = dict(os.environ)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        os.environ.pop("HPU_NB_DEVICE", None)
        try:
            NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                           resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
        finally:
            os.environ.clear()
            os.environ.update(env)
        _cache[name] = Executed(nb)
    return _cache[name]


def test_notebooks_store_cell_ids() -> None:
    """nbformat 4.5 notebooks carry an id per cell (otherwise nbformat warns on every read)."""
    for path in sorted(NOTEBOOKS.glob("0[1-6]_*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        assert nb.nbformat_minor >= 5 and all(c.get("id") for c in nb.cells), path.name


def test_01_inuse_after_fit_is_what_the_text_says() -> None:
    nb = executed("01_getting_started")
    i = nb.cell("get_device_stats")
    printed = nb.out(i)
    assert re.search(r"^\s+InUse\s+0 B$", printed, re.M), printed
    assert "InUse after fit: 0 B (the model is back on the host)" in printed
    assert "`InUse` is back to 0 B" in nb.markdown() and "MaxInUse` keeps the run's peak" in nb.markdown()
    peak = float(re.search(r"peak is ([\d.]+)x the parameters", printed).group(1))
    assert peak > 1.0  # gradients and activations came on top of the parameters


def test_02_op_lists_change_the_dtypes() -> None:
    nb = executed("02_mixed_precision")
    i = nb.cell("dtypes_in_step")
    rows = {line[:28].strip(): line[28:].split() for line in nb.out(i).splitlines()[1:3]}
    # as the text says: Habana's defaults put linear and softmax in bf16, exp in fp32; the files (linear fp32,
    # exp bf16) replace the lists, so softmax, in neither, runs in its input's dtype
    assert rows["bf16-mixed (default lists)"] == ["torch.bfloat16", "torch.bfloat16", "torch.float32"], rows
    assert rows["with the op-list files"] == ["torch.float32", "torch.float32", "torch.bfloat16"], rows
    text = " ".join(nb.markdown().split())
    assert "`linear` and `softmax` in bf16, `exp` in fp32" in text
    assert ("force `linear` to fp32 and `exp` to bf16, and `softmax`, now in neither list, runs in the dtype of its "
            "input") in text
    assert "keep the projections" in nb.source(i)  # the file has a comment line ...
    assert "keep the projections" not in nb.out(i, "stderr") and "'#" not in nb.out(i, "stderr")  # ... no warning
    typo = nb.out(nb.cell("typo.txt"))
    assert "unknown op 'softmaxx'" in typo and "Did you mean 'softmax'" in typo


def test_02_autocast_sections_print_bf16() -> None:
    nb = executed("02_mixed_precision")
    printed = nb.out(nb.cell("hpu_autocast(torch.bfloat16)"))
    assert "inside enabled=False: torch.float32" in printed
    assert "plugin's autocast:    torch.bfloat16" in printed
    assert "hpu_autocast decorator: torch.bfloat16" in printed


def test_02_fp8_ends_where_the_text_says() -> None:
    nb = executed("02_mixed_precision")
    table = nb.out(nb.cell("runs = {p: train(p)"))
    fp8 = re.search(r"^fp8\s+\[torch\.float32\]\s+([\d.]+)\s+([+-][\d.]+)%", table, re.M)
    assert fp8, table
    claim = re.search(r"within (\d+)% of bf16's final\s+loss", nb.markdown())
    assert claim, "02 names how close fp8 ends to bf16"
    assert abs(float(fp8.group(2))) <= float(claim.group(1)), table
    readme = (ROOT / "README.md").read_text()
    if "within 2% of bf16" in readme:
        assert abs(float(fp8.group(2))) <= 2.0, table
    error = float(re.search(r'"relative_error": ([\d.e-]+)', nb.out(nb.cell("quantize = "))).group(1))
    assert 0 < error < 0.1  # "a few percent on the output"


def test_04_text_names_what_the_chart_and_summary_show() -> None:
    nb = executed("04_monitoring_and_config")
    js = (ROOT / "hpu_nb" / "notebook" / "static" / "training_chart.js").read_text()
    for label in ("memory axis: auto", "memory axis: Limit"):
        assert f"**{label}**" in nb.markdown() and f'"{label}"' in js
    assert "`y:`" not in nb.markdown()
    i = nb.cell("callbacks=[monitor]")
    summary = nb.out(i, "text/plain")
    assert "per step (median, as the chart)" in summary and "wall clock over" in summary
    assert "throughput per step, samples/s" in js and "throughput per step (samples/s; a smoothed line" in nb.markdown()
    html = nb.out(i, "text/html")
    assert 'data-hpu-snapshot="MemoryMonitor"' in html and "<svg" in html
    assert 'data-hpu-snapshot="Trainer configuration"' in nb.out(nb.cell("cfg = hpu_nb.TrainerConfigWidget"),
                                                                  "text/html")


# -- quiet output: the stderr of each executed tutorial holds no warning hpu_nb could have prevented -----------------
TUTORIALS = sorted(path.stem for path in NOTEBOOKS.glob("0[1-7]_*.ipynb"))

# A stderr line is a warning when it names one: Python's "<file>:<line>: XWarning: ...", C++'s "Warning: ..." and
# "[W<date> ...]" (torch's TORCH_WARN), DeepSpeed's and logging's "[WARNING]" / "WARNING:".
WARNING_LINE = re.compile(r"\w*Warning\b|\bwarning\b|^\[W\d{3,}|\[WARNING\]|^WARNING:", re.IGNORECASE)

# Warnings a tutorial may print, each with why: the user caused it (the cell shows it on purpose) or neither hpu_nb
# nor the user can prevent it. Everything else is hpu_nb's to filter at its source (hpu_nb.core.noise).
ALLOWED: dict[str, list[tuple[str, str]]] = {
    # the op-list files are given to the plugin after `import torch`: the emulated Gaudi applies them, a Gaudi would
    # not; the warning says what to set instead (an action for the user, who caused it)
    "02_mixed_precision": [(r"UserWarning: HPUPrecisionPlugin: the emulated Gaudi loaded these op lists now",
                            "op lists set after import: on a Gaudi they need the environment before Python starts")],
    # wrap_in_hpu_graph / HPUGraph on the emulated Gaudi: no graph is captured (same results, no speed-up); the user
    # asked for a graph and should know the emulation does not make one
    "06_fabric_graphs_tenancy": [(r"HPUGraphEmulationWarning: hpu_nb: the emulated Gaudi captures no HPU graph",
                                  "the user asked for an HPU graph, which the emulation does not capture")],
}


@pytest.mark.parametrize("name", TUTORIALS)
def test_tutorial_stderr_has_no_warning_hpu_nb_could_prevent(name: str) -> None:
    nb = executed(name)
    warnings = [f"cell {i}: {line}" for i, cell in enumerate(nb.nb.cells) if cell.cell_type == "code"
                for line in nb.out(i, "stderr").splitlines() if WARNING_LINE.search(line)]
    allowed = [pattern for pattern, _why in ALLOWED.get(name, [])]
    unexplained = [line for line in warnings if not any(re.search(p, line) for p in allowed)]
    assert len(unexplained) == 0, f"{len(unexplained)} warning line(s) in {name}'s stderr:\n" + "\n".join(unexplained)

"""Run Habana's Gaudi-tutorials notebooks headless on the emulated Gaudi, and say per notebook what happened.

    python tools/run_gaudi_tutorials.py CHECKOUT [--model-references DIR] [--only NAME ...] [--out DIR] [--setup]

CHECKOUT is a work tree of github.com/HabanaAI/Gaudi-tutorials; DIR one of HabanaAI/Model-References (the notebooks
that `git clone` it get a copy of it). Nothing of theirs is copied into this repository: the notebooks are read from the
checkout, copied to --out (default /tmp/gaudi_tutorials) and executed there with nbclient, one at a time, in the
kernel of `.venv-tutorials` (`--setup` makes it: a layer over `.venv-transformers`, as .ci/layered_venv.py layers the
optimum one, with torchvision, datasets, pandas, scipy, scikit-learn; torch and everything below stay as they are).

What is stood in for, and never hidden:
- the network: data sets, hub models and downloaded files (tools/gaudi_tutorials_standins/: data sets with the real
  APIs whose labels are a fixed, learnable function of the image or text, tiny random models of the named
  architecture, an MNIST checkpoint trained on the stand-in), loaded by a sitecustomize in the kernel and in every
  process a notebook starts;
- installs (`!pip install`, `git clone` of a repository the notebook then uses), logins, `exit()`, servers (docker,
  gradio) and `input()` (answered with a fixed prompt): skipped or replaced, each said in the report. TensorBoard
  (`%load_ext tensorboard`, `%tensorboard`) runs: its server is stopped when the notebook ends;
- sizes and steps (epochs, iterations, batch sizes, model sizes, the stand-in data sets' sizes, how often a loss is
  printed, a learning rate raised for a run cut short): the per-notebook EDITS and CUTS below, each said in the
  report. Nothing else in a notebook's code is changed.

What counts as running (`judge`): no error, the `hpu` device used (the emulated card's allocation counter, read by the
sitecustomize at each process's exit), and the notebook's own check: a training loss that falls on `hpu` (CHECKS:
read from the lines the notebook prints, or for Lightning from a callback the sitecustomize adds), or an inference
accuracy far above chance. A notebook that never allocates on `hpu` is reported as such, not as running on it.
Not part of `make test`: CI has no checkout of Gaudi-tutorials. The table it prints is kept in docs/gaudi_tutorials.md;
tests/third_party/test_gaudi_tutorials_runner.py tests the runner's own logic without a checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STANDINS = Path(__file__).resolve().parent / "gaudi_tutorials_standins"
VENV = ROOT / ".venv-tutorials"
BASE_VENV = ROOT / ".venv-transformers"
# tensorboard: the Lightning MNIST tutorial's `%load_ext tensorboard` (the base's, pinned by the constraints, if there)
LAYER_PACKAGES = ("torchvision", "datasets", "pandas", "scipy", "scikit-learn", "tensorboard")
KERNEL = "gaudi-tutorials"


@dataclass(frozen=True)
class Edit:
    """In the first cell whose source matches `cell`, `old` (a regex; None: the whole cell) becomes `new`."""

    cell: str
    old: str | None
    new: str | Callable[[re.Match[str]], str]
    why: str


@dataclass(frozen=True)
class Training:
    """The loss must fall on `hpu` (`falls`). `pattern` (one group: the loss) is matched in the printed output of the
    cells matching `cell` (and of the processes they start); pattern None: the losses the Lightning callback recorded,
    each fit on its own."""

    pattern: str | None = None
    cell: str = ""


@dataclass(frozen=True)
class Inference:
    """An accuracy printed by the notebook (`pattern`, one group: a percentage) must reach `at_least`: the stand-in
    checkpoint is trained, so a right `hpu` forward pass scores near 100%, a broken one near chance (10%)."""

    pattern: str
    at_least: float = 90.0


FALL = 0.9
PROBE_CELL = "import tutorial_standins\ntutorial_standins.probe_write_device_use()"


@dataclass(frozen=True)
class Tutorial:
    path: str
    edits: tuple[Edit, ...] = ()
    check: Training | Inference | None = None  # None: nothing in it trains or scores
    cuts: tuple[str, ...] = ()  # sizes of the stand-in data cut from the real data set's
    note: str = ""


def _model_references(clone_dir: str = "Model-References") -> Edit:
    return Edit(r"git clone .*Model-References", r"!git clone [^\n]*Model-References[^\n]*",
                f"!cp -r $GAUDI_TUTORIALS_MODEL_REFERENCES {clone_dir}",
                "stand-in: `git clone Model-References` copies the local Model-References work tree")


_MIGRATION_ARGS = Edit(r"train\.py --batch-size=256", r"--batch-size=256 (.*)--workers=8",
                       r"--batch-size=8 \1--workers=0 --print-freq=1 --lr=0.003",
                       "size: batch 256 -> 8 and the learning rate with it, 0.1 -> 0.003 (linear scaling: at 0.1 the"
                       " 8-image steps of a ResNet50 from scratch diverge, loss 2.3 -> 38); 8 loader workers -> 0; the"
                       " loss printed every step (--print-freq=1)")
_TINY_IMAGENET = Edit(r"wget .*tiny-imagenet", None,
                      "import tutorial_standins, os\n"
                      "tutorial_standins.write_image_folder(os.path.expanduser('~/datasets/tiny-imagenet-200'))\n"
                      "tutorial_standins.write_image_folder('./datasets/tiny-imagenet-200')",
                      "stand-in: tiny-imagenet (wget + unzip) is an ImageFolder of images tinted by class")
_TINY_IMAGENET_CUT = "tiny-imagenet stand-in: 200 classes x 500 train / 50 val images -> 10 classes x 8 / 8"
_MNIST_CHECKPOINT = Edit(r"wget .*mnist-epoch_20\.pth", None,
                         "import tutorial_standins\n"
                         "tutorial_standins.write_mnist_checkpoint('mnist-epoch_20.pth')",
                         "stand-in: the downloaded mnist-epoch_20.pth is an MLP of the same shapes trained on the CPU"
                         " on the MNIST stand-in (60 steps)")
_ACCURACY = Inference(r"Accuracy: ([\d.]+)%")
# train.py's MetricLogger: "Epoch: [0]  [ 3/10] ... loss: MEDIAN (MEAN)" (the Test lines are not training losses)
_MIGRATION_LOSS = Training(r"^Epoch: \[\d+\].*\bloss: ([\d.]+) \(", r"torchrun .*train\.py")
_SQUAD_CUT = "SQuAD stand-in: 87,599 / 10,570 rows -> 70 / 21"
_FLOWERS_CUT = "Flowers102 stand-in: 1,020 train images -> 70"
_GLUE_CUT = "GLUE stand-in: 64 train / 32 validation rows per task"

TUTORIALS = (
    Tutorial("Lightning/Introduction/mnist-hello-world.ipynb",
             (Edit(r"mnist_model = MNISTModel", "max_epochs=3", "max_epochs=1", "steps: 3 epochs -> 1"),
              Edit(r"model = LitMNIST\(\)", "max_epochs=3", "max_epochs=1", "steps: 3 epochs -> 1")),
             Training()),
    Tutorial("Lightning/Finetune Transformers/finetune-transformers.ipynb",
             (Edit(r"task_name=\"mnli\"", None, "pass", "steps: the third fine-tuning (MNLI) is not run"),),
             Training(), cuts=(_GLUE_CUT,)),
    Tutorial("Lightning/DeepSpeed_Lightning/mingpt/demo.ipynb",
             (Edit(r"max_iters = 2000", "max_iters = 2000", "max_iters = 50", "steps: 2000 iterations -> 50"),
              Edit(r"def batch_end_callback", r"iter_num % 100 == 0", "iter_num % 10 == 0",
                   "the loss printed every 10 iterations (was 100: 50 iterations would print one)")),
             Training(r"train loss ([\d.]+)", r"trainer\.run\(\)")),
    Tutorial("Lightning/DeepSpeed_Lightning/nanogpt/scaling_laws.ipynb"),
    Tutorial("Lightning/DeepSpeed_Lightning/nanogpt/transformer_sizing.ipynb"),
    Tutorial("Lightning/DeepSpeed_Lightning/DeepSpeed_Lightning.ipynb",
             (Edit(r"train\.py --implementation", "--model_type gpt2-xl", "--model_type gpt-nano --max_steps 3",
                   "size: gpt2-xl (1.5B) -> gpt-nano, 3 steps"),),
             Training()),
    Tutorial("PyTorch/Training a Classifier/cifar10_tutorial.ipynb",
             (Edit(r"optim\.SGD\(model\.parameters\(\)", r"lr=0\.001", "lr=0.01",
                   "the hpu run's learning rate 0.001 -> 0.01, so that its 126 steps (2 epochs of the cut data"
                   " set; the real run has 1,563) learn"),
              Edit(r"inputs\.to\(device\)", r"i % 200 == 199(.|\n)*running_loss / 200",
                   lambda m: m.group(0).replace("200 == 199", "20 == 19").replace("/ 200", "/ 20"),
                   "the hpu run's loss printed every 20 steps (was 200: the cut data set has 63 per epoch)")),
             Training(r"loss: ([\d.]+)", r"inputs\.to\(device\)"),
             cuts=("CIFAR10 stand-in: 50,000 / 10,000 images -> 4,000 / 400",)),
    Tutorial("PyTorch/Inference/Gaudi_inference_ex1.ipynb", (_MNIST_CHECKPOINT,), _ACCURACY),
    Tutorial("PyTorch/Inference/Gaudi_inference_ex2.ipynb", (_MNIST_CHECKPOINT,), _ACCURACY),
    Tutorial("PyTorch/Inference/Gaudi_inference_ex3.ipynb", (_MNIST_CHECKPOINT,), _ACCURACY),
    Tutorial("PyTorch/Detecting_Dynamic_Shapes/Detecting_Dynamic_Shapes.ipynb", cuts=(_FLOWERS_CUT, _SQUAD_CUT)),
    Tutorial("PyTorch/GPU_Migration/GPU_Migration.ipynb", (_model_references(), _TINY_IMAGENET, _MIGRATION_ARGS),
             _MIGRATION_LOSS, cuts=(_TINY_IMAGENET_CUT,)),
    Tutorial("PyTorch/Single_card_tutorials/model_migrate_single.ipynb",
             (_model_references(), _TINY_IMAGENET, _MIGRATION_ARGS), _MIGRATION_LOSS, cuts=(_TINY_IMAGENET_CUT,)),
    Tutorial("PyTorch/Single_card_tutorials/Intel_Gaudi_Quick_Start_single.ipynb",
             (_model_references(),
              Edit(r"%run mnist\.py", r"--autocast%run mnist\.py .*",
                   "--autocast --max-training-step 40 --log-interval 5",
                   "typo + steps: Habana's cell joins two identical `%run mnist.py` lines without a newline (argparse"
                   " refuses `--autocast%run`); run once, 40 steps, the loss printed every 5 (was 10)"),
              Edit(r"git clone -b v1\.16\.0 https://github.com/huggingface/optimum-habana", None, "pass",
                   "not run: the optimum-habana 1.16 half (run_glue.py, bert-large)"),
              Edit(r"examples/text-classification", None, "pass", "not run: the optimum-habana 1.16 half"),
              Edit(r"%run run_glue\.py(.|\n)*--do_train", None, "pass", "not run: the optimum-habana 1.16 half"),
              Edit(r"%run run_glue\.py", None, "pass", "not run: the optimum-habana 1.16 half")),
             Training(r"Loss: ([\d.]+)", r"%run mnist\.py")),
)

NOT_RUN = {
    "PyTorch/vLLM_Tutorials/*, PyTorch/TGI_Gaudi_tutorial, PyTorch/RAG_Application, "
    "PyTorch/Single_card_tutorials/RAG-on-Intel-Gaudi-single":
        "serving (vLLM fork / TGI / TEI in docker) of 8B-70B models: no docker, no Gaudi serving stack here",
    "PyTorch/Fine_Tuning, PyTorch/Inference/Intel_Gaudi_Inference, PyTorch/llama2_fine_tuning_inference, "
    "PyTorch/Single_card_tutorials/llama2_fine_tuning_inference_single, PyTorch/Transformer_Reinforcement_Learning, "
    "PyTorch/Hugging_Face_pipelines/Benchmarking_on_Optimum-habana_with_fp8, PyTorch/localGPT_inference":
        "optimum-habana 1.16 example scripts on Llama 7B-70B (gated hub weights, 8-card DeepSpeed)",
    "PyTorch/Hugging_Face_pipelines/{generation_pipeline,image-classification,translation,visual-question-answering},"
    " PyTorch/Single_card_tutorials/stable_diffusion_v_2_1_single, PyTorch/Profiling_and_Optimization":
        "optimum-habana 1.16 (end of support; its 1.21.2 pins transformers 4) pipelines and example scripts",
    "PyTorch/Pre_Training": "Megatron-LM (HabanaAI fork) pre-training on RedPajama",
    "PyTorch/Intel_Gaudi_Quickstart": "hello-world over `mpirun -n 8` (no MPI here) and optimum-habana 1.16 run_glue",
    "Lightning/DeepSpeed_Lightning/mingpt/generate": "minGPT's from_pretrained('gpt2-xl') checks the real weights",
}

# Lines a notebook runs that are the environment's business, not the tutorial's: skipped, each said in the report.
_SKIPPED_LINES = (
    (re.compile(r"^\s*(!|%)\s*(pip|\{sys.executable\} -m pip)\b.*install"), "install: the environment's"),
    (re.compile(r"^\s*%pip\b"), "install: the environment's"),
    (re.compile(r"^\s*!\s*huggingface-cli login"), "hub login: no hub here"),
    (re.compile(r"^\s*exit\(\)"), "exit(): would end the kernel"),
    (re.compile(r"^\s*!\s*(apt-get|docker)\b"), "system packages / docker: not here"),
    (re.compile(r"^\s*!\s*(wget|unzip)\b"), "a download no later cell uses: no network here"),
)


@dataclass
class Result:
    path: str
    status: str = "not run"
    error: str = ""
    error_cell: int | None = None
    cells: int = 0
    seconds: float = 0.0
    changes: list[str] = field(default_factory=list)
    hpu_allocations: int = 0  # on the emulated card, summed over the kernel and the processes it started
    first_loss: float | None = None
    last_loss: float | None = None
    accuracy: float | None = None
    verdict: str = ""  # what the check found, in words


def setup() -> None:
    """.venv-tutorials over .venv-transformers: its packages through a .pth, pins of every base package."""
    sys.path.insert(0, str(ROOT / ".ci"))
    import layered_venv

    python = layered_venv.create_layer(str(BASE_VENV / "bin" / "python"), VENV)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "-c", str(VENV / "constraints.txt"), *LAYER_PACKAGES],
                   check=True)
    write_scripts()


def write_scripts() -> None:
    """torchrun and tensorboard of this environment (the base's run the base's Python, without the layer's packages;
    TensorBoard's notebook magic starts `tensorboard` from PATH)."""
    for name, entry in (("torchrun", "from torch.distributed.run import main"),
                        ("tensorboard", "from tensorboard.main import run_main as main")):
        script = VENV / "bin" / name
        # the guard: TensorBoard's profiler plugin starts a multiprocessing manager, whose spawned child imports this
        script.write_text(f"#!{VENV / 'bin' / 'python'}\n{entry}\nif __name__ == '__main__':\n    main()\n")
        script.chmod(0o755)


def _prepare_cells(nb: dict, tutorial: Tutorial, home: Path) -> list[str]:
    changes: list[str] = []
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    for edit in tutorial.edits:
        cell = next((c for c in code if re.search(edit.cell, "".join(c["source"]))), None)
        if cell is None:
            changes.append(f"(edit not applied, cell not found: {edit.why})")
            continue
        source = "".join(cell["source"])
        if edit.old is None:
            cell["source"] = edit.new
        else:
            cell["source"], count = re.subn(edit.old, edit.new, source)
            if count == 0:
                changes.append(f"(edit not applied, text not found: {edit.why})")
                continue
        changes.append(edit.why)
    for cell in code:
        lines = "".join(cell["source"]).split("\n")
        for i, line in enumerate(lines):
            for pattern, why in _SKIPPED_LINES:
                if pattern.search(line):
                    lines[i] = f"# [run_gaudi_tutorials] skipped ({why}): {line.strip()}"
                    changes.append(f"skipped `{line.strip()[:60]}`: {why}")
                    break
        source = "\n".join(lines)
        if "/root/" in source:
            source = source.replace("/root/", f"{home}/")
            changes.append("path: /root/ -> the run's home")
        cell["source"] = source
    return changes


def _first_error(cell: dict) -> str | None:
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return f"{output['ename']}: {output['evalue']}"[:400]
        text = output.get("text", "")
        text = "".join(text) if isinstance(text, list) else text
        if output.get("output_type") == "stream" and re.search(r": command not found|^fatal: ", text, re.M):
            return f"(shell) {text.strip().splitlines()[-1]}"[:400]
        if output.get("output_type") == "stream" and "Traceback (most recent call last)" in text:
            tail = [ln for ln in text.split("Traceback (most recent call last)")[-1].splitlines() if ln.strip()]
            last = next((ln for ln in reversed(tail) if re.match(r"^\w+(\.\w+)*(Error|Exception|Interrupt)\b", ln)),
                        tail[-1] if tail else "")
            return f"(in a process the cell started) {last.strip()}"[:400]
    return None


def _kernel_spec(out: Path, home: Path, model_references: Path | None, probes: Path) -> None:
    python = VENV / "bin" / "python"
    env = {
        "GAUDI_TUTORIALS_STANDINS": "1", "HOME": str(home),
        "PYTHONPATH": os.pathsep.join(p for p in (str(STANDINS), os.environ.get("PYTHONPATH", "")) if p),
        "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "MPLBACKEND": "Agg",
        "PATH": f"{VENV / 'bin'}:{os.environ.get('PATH', '')}",
        "GAUDI_TUTORIALS_PROBE_DIR": str(probes),
        # TensorBoard's notebook magic records the servers it starts under the temporary directory: the run's own
        "TMPDIR": str(out / "tmp"),
        "GAUDI_TUTORIALS_MODEL_REFERENCES": str(model_references or ""),
        # the emulated device's library, compiled once: the user's cache, not a new one in the run's home
        "HPU_NB_CACHE_DIR": os.environ.get("HPU_NB_CACHE_DIR") or str(Path.home() / ".cache" / "hpu_nb"),
    }
    spec = out / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Gaudi tutorials (emulated Gaudi)", "language": "python", "env": env}))
    os.environ["JUPYTER_PATH"] = str(out / "jupyter")


def cell_text(cell: dict[str, Any]) -> str:
    """What a code cell printed (streams and plain-text results), processes it started included."""
    parts = []
    for output in cell.get("outputs", []):
        text = output.get("text") if output.get("output_type") == "stream" else \
            output.get("data", {}).get("text/plain")
        if text:
            parts.append("".join(text) if isinstance(text, list) else text)
    return "".join(parts)


def printed_values(nb: dict[str, Any], pattern: str, cell: str = "") -> list[float]:
    """Every value `pattern` (one group) finds in the output of the code cells whose source matches `cell`, in
    order. Progress bars redraw a line with carriage returns: each drawing counts once."""
    values: list[float] = []
    for code in (c for c in nb["cells"] if c["cell_type"] == "code"):
        if cell and not re.search(cell, "".join(code["source"])):
            continue
        for line in re.split(r"[\r\n]+", cell_text(code)):
            values += [float(m.group(1)) for m in re.finditer(pattern, line)]
    return values


def falls(losses: list[float]) -> bool:
    """The mean of the last quarter (at least one value) below FALL x the mean of the first values (up to 3, at most
    a quarter): a training that learns the stand-in's labelling does, even one that has learnt it within its first
    quarter; one whose steps change nothing stays at its start (chance: the log of the class count)."""
    if len(losses) < 2:
        return False
    quarter = max(1, len(losses) // 4)
    first, last = losses[:min(3, quarter)], losses[-quarter:]
    return sum(last) / len(last) < FALL * sum(first) / len(first)


def read_probes(probes: Path) -> tuple[int, dict[str, list[tuple[float, str]]]]:
    """(allocations on `hpu` over all processes, the Lightning losses per fit as (value, device)), from the files the
    sitecustomize wrote (tutorial_standins.probe_write_device_use, patch_lightning)."""
    allocations, fits = 0, {}
    for path in sorted(probes.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if path.name.startswith("device-"):
                allocations += int(record["hpu_allocations"])
            else:
                fits.setdefault(record["fit"], []).append((float(record["loss"]), record["device"]))
    return allocations, fits


def judge(result: Result, check: Training | Inference | None, nb: dict[str, Any],
          fits: dict[str, list[tuple[float, str]]]) -> None:
    """The status of a notebook that ran without error: on `hpu` or not, and its check (see Training, Inference)."""
    if isinstance(check, Inference):
        values = printed_values(nb, check.pattern)
        result.accuracy = values[-1] if values else None
    elif isinstance(check, Training) and check.pattern is not None:
        losses = printed_values(nb, check.pattern, check.cell)
        learned = falls(losses)
        result.first_loss, result.last_loss = (losses[0], losses[-1]) if losses else (None, None)
        result.verdict = f"{len(losses)} losses printed, {'falls' if learned else 'does not fall'}"
    elif isinstance(check, Training):
        verdicts, learned, devices = [], bool(fits), set()
        for values in fits.values():
            losses = [v for v, _ in values]
            devices |= {d for _, d in values}
            learned = learned and falls(losses)
            verdicts.append(f"{losses[0]:.3f} -> {losses[-1]:.3f}")
            result.first_loss = losses[0] if result.first_loss is None else result.first_loss
            result.last_loss = losses[-1]
        result.verdict = (f"{len(fits)} fit(s), per step on {'/'.join(sorted(devices)) or 'nothing'}: "
                          f"{'; '.join(verdicts)}, {'falls' if learned else 'does not fall'}")
        learned = learned and devices == {"hpu"}
    if result.hpu_allocations == 0:
        result.status = "runs, never touches hpu"
    elif check is None:
        result.status = "runs on hpu (nothing in it trains or scores)"
    elif isinstance(check, Inference):
        scored = result.accuracy is not None and result.accuracy >= check.at_least
        result.status = "runs on hpu" if scored else "fails the check on hpu"
        result.verdict = f"accuracy {result.accuracy}% (at least {check.at_least}%)"
    else:
        result.status = "runs on hpu" if learned else "fails the check on hpu"


def _stop_tensorboards(out: Path) -> list[str]:
    """Stop the TensorBoard servers a notebook's `%tensorboard` started (recorded under the run's TMPDIR)."""
    stopped = []
    for info in (out / "tmp" / ".tensorboard-info").glob("pid-*.info"):
        record = json.loads(info.read_text())
        try:
            os.kill(int(record["pid"]), 15)
            stopped.append(f"TensorBoard started on port {record['port']} (stopped after the run)")
        except ProcessLookupError:
            pass
        info.unlink()
    return stopped


def run(tutorial: Tutorial, copy: Path, home: Path, out: Path, cell_timeout: int) -> Result:
    import nbformat
    from nbclient import NotebookClient

    result = Result(tutorial.path)
    notebook = copy / tutorial.path
    nb = nbformat.read(notebook, as_version=4)
    result.changes = [*_prepare_cells(nb, tutorial, home), *tutorial.cuts]
    result.cells = sum(c["cell_type"] == "code" for c in nb["cells"])
    probes = out / "probes"
    shutil.rmtree(probes, ignore_errors=True)
    probes.mkdir(parents=True)
    (out / "tmp").mkdir(exist_ok=True)
    # The kernel's own use of `hpu`, read by a last cell of the runner's (a kernel's shutdown skips exit handlers),
    # taken out of the notebook again once run.
    nb["cells"].append(nbformat.v4.new_code_cell(PROBE_CELL))
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name=KERNEL, allow_errors=True,
                            resources={"metadata": {"path": str(notebook.parent)}})
    start = time.monotonic()
    try:
        client.execute()
    except Exception as error:  # a cell past its timeout, a kernel that died
        result.status, result.error = "fails", f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:300]}"
    result.seconds = round(time.monotonic() - start, 1)
    result.changes += _stop_tensorboards(out)
    if nb["cells"] and "".join(nb["cells"][-1]["source"]) == PROBE_CELL:
        nb["cells"].pop()
    executed = out / "executed" / tutorial.path
    executed.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, executed)
    result.hpu_allocations, fits = read_probes(probes)
    if result.status == "fails":
        return result
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    for index, cell in enumerate(code):
        error = _first_error(cell)
        if error is not None:
            result.status, result.error, result.error_cell = "fails", error, index
            return result
    judge(result, tutorial.check, nb, fits)
    return result


def _loss(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", type=Path, nargs="?")
    parser.add_argument("--model-references", type=Path)
    parser.add_argument("--only", nargs="*", default=[], help="run the tutorials whose path contains one of these")
    parser.add_argument("--out", type=Path, default=Path("/tmp/gaudi_tutorials"))
    parser.add_argument("--cell-timeout", type=int, default=900)
    parser.add_argument("--setup", action="store_true", help="make .venv-tutorials first")
    args = parser.parse_args()
    if args.setup or not VENV.exists():
        setup()
    write_scripts()
    if args.checkout is None:
        return
    home = args.out / "home"
    copy = home / "Gaudi-tutorials"
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(args.checkout, copy, ignore=shutil.ignore_patterns(".git"))
    _kernel_spec(args.out, home, args.model_references.resolve() if args.model_references else None,
                 args.out / "probes")
    results_file = args.out / "results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    chosen = [t for t in TUTORIALS if not args.only or any(name in t.path for name in args.only)]
    for tutorial in chosen:
        print(f"== {tutorial.path}", flush=True)
        result = run(tutorial, copy, home, args.out, args.cell_timeout)
        results[tutorial.path] = result.__dict__
        results_file.write_text(json.dumps(results, indent=1))
        where = "" if result.error_cell is None else f": code cell {result.error_cell}"
        print(f"   {result.status} ({result.seconds} s){where} {result.error} {result.verdict}"
              f" [hpu allocations {result.hpu_allocations}]", flush=True)
    print("\n| notebook | result | first / last loss, or accuracy | changes |\n| --- | --- | --- | --- |")
    for path, r in results.items():
        where = f" (code cell {r['error_cell']})" if r["error_cell"] is not None else ""
        score = f"{r['accuracy']}%" if r.get("accuracy") is not None else \
            f"{_loss(r.get('first_loss'))} / {_loss(r.get('last_loss'))}" if r.get("first_loss") is not None else ""
        print(f"| {path} | {r['status']}{where} {r['error']} {r.get('verdict', '')} | {score} |"
              f" {'; '.join(dict.fromkeys(r['changes']))} |")
    counts: dict[str, int] = {}
    for r in results.values():
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print("\n" + ", ".join(f"{status}: {n}" for status, n in sorted(counts.items())))


if __name__ == "__main__":
    main()

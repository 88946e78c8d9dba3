"""Run Habana's Gaudi-tutorials notebooks headless on the emulated Gaudi, and say per notebook what happened.

    python tools/run_gaudi_tutorials.py CHECKOUT [--model-references DIR] [--only NAME ...] [--out DIR] [--setup]

CHECKOUT is a work tree of github.com/HabanaAI/Gaudi-tutorials; DIR one of HabanaAI/Model-References (the notebooks
that `git clone` it get a copy of it). Nothing of theirs is copied into this repository: the notebooks are read from the
checkout, copied to --out (default /tmp/gaudi_tutorials) and executed there with nbclient, one at a time, in the
kernel of `.venv-tutorials` (`--setup` makes it: a layer over `.venv-transformers`, as .ci/layered_venv.py layers the
optimum one, with torchvision, datasets, pandas, scipy, scikit-learn; torch and everything below stay as they are).

What is stood in for, and never hidden:
- the network: data sets, hub models and downloaded files (tools/gaudi_tutorials_standins/: tiny random data sets
  with the real APIs, tiny random models of the named architecture, a random checkpoint of the right shapes), loaded
  by a sitecustomize in the kernel and in every process a notebook starts;
- installs (`!pip install`, `git clone` of a repository the notebook then uses), logins, `exit()`, servers (docker,
  tensorboard, gradio) and `input()` (answered with a fixed prompt): skipped or replaced, each said in the report;
- sizes and steps (epochs, iterations, batch sizes, model sizes): the per-notebook EDITS below, each said in the
  report. Nothing else in a notebook's code is changed.
Not part of `make test`: CI has no checkout of Gaudi-tutorials. The table it prints is kept in docs/gaudi_tutorials.md.
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
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STANDINS = Path(__file__).resolve().parent / "gaudi_tutorials_standins"
VENV = ROOT / ".venv-tutorials"
BASE_VENV = ROOT / ".venv-transformers"
LAYER_PACKAGES = ("torchvision", "datasets", "pandas", "scipy", "scikit-learn")
KERNEL = "gaudi-tutorials"


@dataclass(frozen=True)
class Edit:
    """In the first cell whose source matches `cell`, `old` (a regex; None: the whole cell) becomes `new`."""

    cell: str
    old: str | None
    new: str
    why: str


@dataclass(frozen=True)
class Tutorial:
    path: str
    edits: tuple[Edit, ...] = ()
    prepare: tuple[str, ...] = ()  # stand-in files made before the run: "mnist_checkpoint", "tiny_imagenet"
    note: str = ""


def _model_references(clone_dir: str = "Model-References") -> Edit:
    return Edit(r"git clone .*Model-References", r"!git clone [^\n]*Model-References[^\n]*",
                f"!cp -r $GAUDI_TUTORIALS_MODEL_REFERENCES {clone_dir}",
                "stand-in: `git clone Model-References` copies the local Model-References work tree")


_MIGRATION_ARGS = Edit(r"train\.py --batch-size=256", r"--batch-size=256 (.*)--workers=8",
                       r"--batch-size=8 \1--workers=0 --dl-worker-type=MP",
                       "size: batch 256 -> 8, 8 loader workers -> 0; --dl-worker-type=MP (torch's DataLoader: Habana's"
                       " media loader, habana_dataloader, is not emulated)")
_TINY_IMAGENET = Edit(r"wget .*tiny-imagenet", None,
                      "import tutorial_standins, os\n"
                      "tutorial_standins.write_image_folder(os.path.expanduser('~/datasets/tiny-imagenet-200'))\n"
                      "tutorial_standins.write_image_folder('./datasets/tiny-imagenet-200')",
                      "stand-in: tiny-imagenet (wget + unzip) is a random ImageFolder, 10 classes x 2 images")
_MNIST_CHECKPOINT = Edit(r"wget .*mnist-epoch_20\.pth", None,
                         "import torch\n"
                         "torch.manual_seed(0)\n"
                         "torch.save({'fc1.weight': torch.randn(256, 784) * 0.03, 'fc1.bias': torch.zeros(256),\n"
                         "            'fc2.weight': torch.randn(64, 256) * 0.06, 'fc2.bias': torch.zeros(64),\n"
                         "            'fc3.weight': torch.randn(10, 64) * 0.1, 'fc3.bias': torch.zeros(10)},\n"
                         "           'mnist-epoch_20.pth')",
                         "stand-in: the downloaded mnist-epoch_20.pth is a random checkpoint of the same shapes")

TUTORIALS = (
    Tutorial("Lightning/Introduction/mnist-hello-world.ipynb",
             (Edit(r"mnist_model = MNISTModel", "max_epochs=3", "max_epochs=1", "steps: 3 epochs -> 1"),
              Edit(r"model = LitMNIST\(\)", "max_epochs=3", "max_epochs=1", "steps: 3 epochs -> 1"))),
    Tutorial("Lightning/Finetune Transformers/finetune-transformers.ipynb",
             (Edit(r"task_name=\"mnli\"", None, "pass", "steps: the third fine-tuning (MNLI) is not run"),)),
    Tutorial("Lightning/DeepSpeed_Lightning/mingpt/demo.ipynb",
             (Edit(r"max_iters = 2000", "max_iters = 2000", "max_iters = 50", "steps: 2000 iterations -> 50"),)),
    Tutorial("Lightning/DeepSpeed_Lightning/nanogpt/scaling_laws.ipynb"),
    Tutorial("Lightning/DeepSpeed_Lightning/nanogpt/transformer_sizing.ipynb"),
    Tutorial("Lightning/DeepSpeed_Lightning/DeepSpeed_Lightning.ipynb",
             (Edit(r"train\.py --implementation", "--model_type gpt2-xl", "--model_type gpt-nano --max_steps 3",
                   "size: gpt2-xl (1.5B) -> gpt-nano, 3 steps"),)),
    Tutorial("PyTorch/Training a Classifier/cifar10_tutorial.ipynb"),
    Tutorial("PyTorch/Inference/Gaudi_inference_ex1.ipynb", (_MNIST_CHECKPOINT,)),
    Tutorial("PyTorch/Inference/Gaudi_inference_ex2.ipynb", (_MNIST_CHECKPOINT,)),
    Tutorial("PyTorch/Inference/Gaudi_inference_ex3.ipynb", (_MNIST_CHECKPOINT,)),
    Tutorial("PyTorch/Detecting_Dynamic_Shapes/Detecting_Dynamic_Shapes.ipynb"),
    Tutorial("PyTorch/GPU_Migration/GPU_Migration.ipynb", (_model_references(), _TINY_IMAGENET, _MIGRATION_ARGS)),
    Tutorial("PyTorch/Single_card_tutorials/model_migrate_single.ipynb",
             (_model_references(), _TINY_IMAGENET, _MIGRATION_ARGS)),
    Tutorial("PyTorch/Single_card_tutorials/Intel_Gaudi_Quick_Start_single.ipynb",
             (_model_references(),
              Edit(r"%run mnist\.py", r"--autocast%run mnist\.py .*", "--autocast --max-training-step 20",
                   "typo + steps: Habana's cell joins two identical `%run mnist.py` lines without a newline (argparse"
                   " refuses `--autocast%run`); run once, 20 steps"),
              Edit(r"git clone -b v1\.16\.0 https://github.com/huggingface/optimum-habana", None, "pass",
                   "not run: the optimum-habana 1.16 half (run_glue.py, bert-large)"),
              Edit(r"examples/text-classification", None, "pass", "not run: the optimum-habana 1.16 half"),
              Edit(r"%run run_glue\.py(.|\n)*--do_train", None, "pass", "not run: the optimum-habana 1.16 half"),
              Edit(r"%run run_glue\.py", None, "pass", "not run: the optimum-habana 1.16 half"))),
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
    (re.compile(r"^\s*%(load_ext tensorboard|tensorboard)\b"), "a TensorBoard server: not started headless"),
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


def setup() -> None:
    """.venv-tutorials over .venv-transformers: its packages through a .pth, pins of every base package."""
    sys.path.insert(0, str(ROOT / ".ci"))
    import layered_venv

    base = str(BASE_VENV / "bin" / "python")
    if VENV.exists():
        shutil.rmtree(VENV)
    import venv

    venv.EnvBuilder(with_pip=True).create(VENV)
    python = VENV / "bin" / "python"
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    lines = [f"import site; site.addsitedir({d!r})" for d in layered_venv.base_site_dirs(base)]
    (Path(own) / "_hpu_nb_base_environment.pth").write_text("\n".join(lines) + "\n")
    (VENV / "constraints.txt").write_text(layered_venv.base_constraints(base))
    subprocess.run([str(python), "-m", "pip", "install", "-q", "-c", str(VENV / "constraints.txt"), *LAYER_PACKAGES],
                   check=True)
    write_torchrun()


def write_torchrun() -> None:
    """torchrun of this environment (the base's runs the base's Python, without the layer's packages)."""
    script = VENV / "bin" / "torchrun"
    script.write_text(f"#!{VENV / 'bin' / 'python'}\nfrom torch.distributed.run import main\nmain()\n")
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
        cell["source"] = edit.new if edit.old is None else re.sub(edit.old, edit.new, source)
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


def _kernel_spec(out: Path, home: Path, model_references: Path | None) -> None:
    python = VENV / "bin" / "python"
    env = {
        "GAUDI_TUTORIALS_STANDINS": "1", "PYTHONPATH": str(STANDINS), "HOME": str(home),
        "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "MPLBACKEND": "Agg",
        "PATH": f"{VENV / 'bin'}:{os.environ.get('PATH', '')}",
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


def run(tutorial: Tutorial, copy: Path, home: Path, out: Path, cell_timeout: int) -> Result:
    import nbformat
    from nbclient import NotebookClient

    result = Result(tutorial.path)
    notebook = copy / tutorial.path
    nb = nbformat.read(notebook, as_version=4)
    result.changes = _prepare_cells(nb, tutorial, home)
    result.cells = sum(c["cell_type"] == "code" for c in nb["cells"])
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name=KERNEL, allow_errors=True,
                            resources={"metadata": {"path": str(notebook.parent)}})
    start = time.monotonic()
    try:
        client.execute()
    except Exception as error:  # a cell past its timeout, a kernel that died
        result.status, result.error = "fails", f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
    result.seconds = round(time.monotonic() - start, 1)
    executed = out / "executed" / tutorial.path
    executed.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, executed)
    if result.status == "fails":
        return result
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    for index, cell in enumerate(code):
        error = _first_error(cell)
        if error is not None:
            result.status, result.error, result.error_cell = "fails", error, index
            return result
    result.status = "runs unchanged" if not result.changes else "runs, with the changes listed"
    return result


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
    if args.checkout is None:
        return
    home = args.out / "home"
    copy = home / "Gaudi-tutorials"
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(args.checkout, copy, ignore=shutil.ignore_patterns(".git"))
    _kernel_spec(args.out, home, args.model_references.resolve() if args.model_references else None)
    results_file = args.out / "results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    chosen = [t for t in TUTORIALS if not args.only or any(name in t.path for name in args.only)]
    for tutorial in chosen:
        print(f"== {tutorial.path}", flush=True)
        result = run(tutorial, copy, home, args.out, args.cell_timeout)
        results[tutorial.path] = result.__dict__
        results_file.write_text(json.dumps(results, indent=1))
        where = "" if result.error_cell is None else f": code cell {result.error_cell}"
        print(f"   {result.status} ({result.seconds} s){where} {result.error}", flush=True)
    print("\n| notebook | result | changes |\n| --- | --- | --- |")
    for path, r in results.items():
        where = f" (code cell {r['error_cell']})" if r["error_cell"] is not None else ""
        print(f"| {path} | {r['status']}{where} {r['error']} | {'; '.join(dict.fromkeys(r['changes']))} |")


if __name__ == "__main__":
    main()

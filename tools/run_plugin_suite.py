"""Run lightning-habana's own test suite and examples on the emulated Gaudi, as its users and its CI ran them, and say
per stage what passed and why the rest failed.

    python tools/run_plugin_suite.py CHECKOUT [--mode as-written|ported] [--stages plain|ci|examples ...]
                                              [--cards 2] [--out DIR] [--timeout 900] [-k EXPR] [--setup]

CHECKOUT is a work tree of github.com/Lightning-AI/lightning-Habana (measured at 5549fa927d55, its last release
branch). Nothing of it is copied into this repository or into CI: this tool reads the checkout, and hpu_nb serves the
`lightning_habana` import paths (hpu_nb/lightning_habana_names.py) because the plugin's `src/` is never put on the
path. Not part of `make test`.

Modes:
- as-written: the plugin's `tests/` and `pyproject.toml` as they are (its addopts, markers, `-W error::FutureWarning`),
  run in the checkout with this tree's hpu_nb first on PYTHONPATH, on an emulated machine of --cards cards
  (HPU_NB_DEVICE_COUNT).
- ported: a copy of `tests/` (in --out) in which only the imports name hpu_nb's modules (`from
  lightning_habana.pytorch.plugins import HPUPrecisionPlugin` -> `from hpu_nb import HPUPrecisionPlugin`, the plugin's
  helpers -> hpu_nb.lightning_habana_utils; PORTED_PATCH_TARGETS says why the patch targets stay); no assertion is
  changed. What that still fails is hpu_nb behaving differently, not a name it does not serve.

Stages:
- plain: `python -m pytest tests` with the plugin's pyproject, nothing else (what a user types).
- ci: the stages of the plugin's `.azure/hpu-tests.yml` (STAGES below, copied from that file's commands), in lazy
  mode where a stage does not set PT_HPU_LAZY_MODE (its image, Gaudi software 1.18, defaulted to lazy): the general
  tests with `--hpus 1 -m "not standalone_only"`, torch.compile in eager mode, DeepSpeed, the op-list override with
  LOWER_LIST / FP32_LIST, and the standalone tests the way its tests/run_standalone_tests.sh runs them (collected with
  `-m <marker>`, then each test alone with `--hpus N`, so Lightning's script launcher re-runs just that test).
- examples: the yml's "Testing HPU examples" commands, each with its own arguments, in a scratch folder whose
  `./data` holds stand-ins for what they download (a small random MNIST in Lightning's demo format, a synthetic
  WikiText-2 text); nothing else of theirs is changed. The tests' MNIST (Lightning's MNISTDataModule, `./data` of the
  checkout, where it would have downloaded it) is stood in for the same way; PL_USE_MOCKED_MNIST=1 makes Lightning read
  it instead of trying torchvision's download.

Every pytest run gets `-p no:cacheprovider`, a junit XML in --out, and `--timeout` (pytest-timeout, so one stuck test
cannot stop the count); the report gives pass / fail / error / skip counts per stage, and the failures grouped by
cause (exception type and the first line of its message, with the known causes of CAUSES named).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE_PYTHON = ROOT / ".venv" / "bin" / "python"
# The plugin's CI environment adds what hpu_nb's .venv lacks: its requirements/_test.txt (scikit-learn < 1.6), and
# from Habana's image tensorboard and torchvision. `--setup` layers them over .venv (as .ci/layered_venv.py layers the
# optimum extra): torch and everything below stay as they are. torchvision only from $TORCH_CPU_INDEX (torch's CPU
# index): PyPI's build is CUDA's, and its ops do not load on the CPU torch (`torchvision::nms does not exist`).
# Without --setup the runner uses .venv, and those tests fail for the environment (said per test).
VENV = ROOT / ".venv-lightning-habana"
LAYER_PACKAGES = ("scikit-learn<1.6", "tensorboard")
PYTHON = VENV / "bin" / "python" if (VENV / "bin" / "python").exists() else BASE_PYTHON
MEASURED_AT = "5549fa927d55"


@dataclass(frozen=True)
class Stage:
    """One step of the plugin's CI: a pytest command (`files`, `args`) or the standalone runner's (`standalone`)."""

    name: str
    files: tuple[str, ...]
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    standalone: str | None = None  # the marker run_standalone_tests.sh collects with; each test then runs alone
    hpus: int = 1


# .azure/hpu-tests.yml at 5549fa927d55, its commands in order (the FSDP stages are commented out there: left out here).
_GENERAL_FABRIC = ("tests/test_fabric/test_accelerator.py", "tests/test_fabric/test_strategy.py",
                   "tests/test_fabric/test_precision.py")
_GENERAL_TORCH = ("tests/test_pytorch/test_accelerator.py", "tests/test_pytorch/test_hpu_graphs.py",
                  "tests/test_pytorch/test_dynamic_shapes.py", "tests/test_pytorch/test_datamodule.py",
                  "tests/test_pytorch/test_profiler.py", "tests/test_pytorch/test_precision.py",
                  "tests/test_pytorch/strategies/test_hpu_parallel.py", "tests/test_pytorch/strategies/test_hpu_ddp.py")
_FUTURE = ("-W", "ignore::FutureWarning")
STAGES = (
    Stage("general-fabric", _GENERAL_FABRIC, ("--hpus", "1", *_FUTURE)),
    Stage("general-pytorch", _GENERAL_TORCH, ("--hpus", "1", *_FUTURE, "-m", "not standalone_only")),
    Stage("compile", ("tests/test_pytorch/test_compile.py",), ("--hpus", "1", *_FUTURE), {"PT_HPU_LAZY_MODE": "0"}),
    Stage("deepspeed", ("tests/test_pytorch/strategies/test_deepspeed.py",), ("-m", "not standalone_only", *_FUTURE)),
    Stage("precision-override", ("tests/test_pytorch/test_precision.py",),
          ("-k", "test_autocast_operators_override", "--runxfail", *_FUTURE),
          {"LOWER_LIST": "tests/test_pytorch/ops_fp32.txt", "FP32_LIST": "tests/test_pytorch/ops_bf16.txt"}),
    Stage("standalone-1-card", ("tests/test_pytorch/strategies/test_hpu_parallel.py",
                                "tests/test_pytorch/test_precision.py", "tests/test_pytorch/test_dynamic_shapes.py"),
          standalone="standalone_only", hpus=1),
    Stage("multi-card-2", ("tests/test_pytorch/test_accelerator.py", "tests/test_pytorch/test_compile.py",
                           "tests/test_pytorch/test_profiler.py"), standalone="standalone", hpus=2),
)
# The yml's "Testing HPU examples" step (run in examples/): each command as written there.
EXAMPLES = (
    ("mnist_trainer", ("pytorch/mnist_trainer.py",), {}),
    ("hpu_graphs-train", ("pytorch/hpu_graphs.py", "-v", "train", "--mode", "capture_and_replay",
                          "make_graphed_callables", "modulecacher"), {}),
    ("hpu_graphs-inference", ("pytorch/hpu_graphs.py", "-v", "inference", "--mode", "capture_and_replay",
                              "wrap_in_hpu_graph"), {}),
    ("hpu_graphs-dynamicity", ("pytorch/hpu_graphs.py", "-v", "dynamicity", "--mode", "dynamic_control_flow",
                               "dynamic_ops"), {}),
    ("language_model", ("pytorch/language_model.py", "-s", "SHARD_GRAD_OP", "-d", "2"), {"PT_HPU_LAZY_MODE": "0"}),
)

# -- ported mode: imports and patch targets renamed, nothing else ----------------------------------------------------
# `from lightning_habana<anything> import A, B` -> `from hpu_nb import A, B` for the classes hpu_nb exports at the top
# (the Trainer's flavour), and the helpers to hpu_nb's module that holds them.
_PORTED_MODULES = {
    "lightning_habana.fabric": "hpu_nb.fabric",
    "lightning_habana.utils": "hpu_nb.lightning_habana_utils",
    "lightning_habana.pytorch.strategies.deepspeed": "hpu_nb.lightning_habana_utils",
    "lightning_habana": "hpu_nb",
}
_PORTED_NAMES_FROM_UTILS = {"_PRECISION_INPUT", "_HPU_DEEPSPEED_AVAILABLE", "supported_reduce_ops",
                            "get_device_name_from_hlsmi", "get_hpu_synapse_version", "device_count",
                            "_LIGHTNING_GREATER_EQUAL_2_3_0"}
# a patch of the plugin's private name -> the hpu_nb name that decides the same thing. The plugin's patch targets
# (is_fp8_available, _INTEL_NEURAL_COMPRESSOR_AVAILABLE, _HPU_SYNAPSE_GREATER_EQUAL_1_17_0 in plugins.precision, the
# parallel module's ParallelStrategy) have no single hpu_nb name deciding the same (hpu_nb asks the runtime's
# generation and fp8 engine): they stay as written, served names whose patching changes nothing hpu_nb does.
PORTED_PATCH_TARGETS: dict[str, str] = {}

# Known causes, by test id (regex) or message (regex): what the measurement found, said once here.
CAUSES: tuple[tuple[str, str, str], ...] = (
    # (where: "id" (the test's id) or "error" (its message and the traceback's `E` lines), regex, cause)
    ("id", r"_GeneratorContextManager object", "the test passes str() of importlib.resources.path(), a context"
     " manager on Python >= 3.9, as its file path: fails on a Gaudi too"),
    ("error", r"No module named 'torchvision'", "environment: torchvision is not installed"),
    ("error", r"No module named 'sklearn'|tensorboard` nor `tensorboardX", "environment: a test dependency of the"
     " plugin's requirements/_test.txt is not installed (scikit-learn, tensorboard)"),
    ("id", r"test_deepspeed::test_lightning_model\[", "environment: DeepSpeed's release (WarmupLR before 0.15 did not"
     " set the first learning rate; README 'DeepSpeed gradient accumulation, and the plugin's 0.0164')"),
    ("error", r"HPU graphs run in lazy mode only", "HPU graphs in eager mode, today's default (the plugin's CI image,"
     " 1.18, defaulted to lazy mode): refused as on a Gaudi"),
    ("id", r"_device_not_hpu\b", "documented: HPU strategies refuse another accelerator when the Trainer is built"),
    ("error", r"device\(type='hpu', index=0\)", "documented: devices are hpu:0, not hpu (FSDP needs the index)"),
)


HABANA_LOGS_DIR = Path("/tmp/lightning_habana_suite_habana_logs")


def _environment(cards: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HPU_NB_DEVICE_COUNT"))}
    env["PYTHONPATH"] = str(ROOT)  # this tree's hpu_nb; the plugin's src/ is never on the path
    env["HPU_NB_DEVICE_COUNT"] = str(cards)
    # Lightning's demo MNIST (the plugin's tests and examples use MNISTDataModule) tries torchvision's download first,
    # and only an HTTPError sends it to its own copy: with PL_USE_MOCKED_MNIST=1 it reads ./data/MNIST (stood in)
    env["PL_USE_MOCKED_MNIST"] = "1"
    # Habana's container images set HABANA_LOGS (the plugin's fp8 tests read it when given no fp8_data_path)
    HABANA_LOGS_DIR.mkdir(parents=True, exist_ok=True)
    env.setdefault("HABANA_LOGS", str(HABANA_LOGS_DIR))
    env["PATH"] = os.pathsep.join([str(PYTHON.parent), env.get("PATH", "")])
    env.update(extra or {})
    return env


SUMMARY_LINE = re.compile(rb"(passed|failed|error|skipped|no tests ran).* in [\d.]+s")
EXIT_GRACE = 60  # seconds a pytest that printed its summary may take to exit before its processes are stopped


def _pytest(cwd: Path, args: list[str], env: dict[str, str], junit: Path, timeout: int, log: Path) -> int:
    """One pytest run, its output appended to `log`. A test that starts Lightning's script launcher from plain pytest
    (a multi-card test run without the plugin's standalone runner) makes the launcher run the same pytest command again
    for each other rank, as on a Gaudi; such a rank can outlive the run. Once pytest printed its summary, what is left
    of its process group after EXIT_GRACE seconds is stopped (and said in the log)."""
    command = [str(PYTHON), "-m", "pytest", *args, "-p", "no:cacheprovider", "-q", "-rN", "--color=no",
               f"--timeout={timeout}", f"--junitxml={junit}"]
    with log.open("a", encoding="utf-8") as out:
        out.write(f"\n$ {' '.join(command)}\n")
        out.flush()
        start = log.stat().st_size
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        summary_seen: float | None = None
        while process.poll() is None:
            time.sleep(5)
            if summary_seen is None:
                with log.open("rb") as text:
                    text.seek(max(start, log.stat().st_size - 4096))
                    if SUMMARY_LINE.search(text.read()):
                        summary_seen = time.monotonic()
            elif time.monotonic() - summary_seen > EXIT_GRACE:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                out.write(f"\n(run_plugin_suite: pytest printed its summary but had not exited {EXIT_GRACE} s later:"
                          " its process group was stopped; a rank process of Lightning's script launcher was left)\n")
        return process.returncode


@dataclass
class Outcome:
    test: str
    result: str  # passed / failed / error / skipped / xfailed
    cause: str = ""


def _read_junit(path: Path) -> list[Outcome]:
    if not path.exists():
        return []
    outcomes = []
    for case in ET.parse(path).getroot().iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        result, cause = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                result = "failed" if child.tag == "failure" else "error"
                cause = _cause_of(test, child.get("message") or "", child.text or "")
            elif child.tag == "skipped":
                result = "xfailed" if (child.get("type") or "").endswith("xfail") else "skipped"
                cause = (child.get("message") or "")[:160]
        outcomes.append(Outcome(test, result, cause))
    return outcomes


def _cause_of(test: str, message: str, text: str) -> str:
    errors = "\n".join([message, *(line for line in text.splitlines() if line.startswith("E "))])
    for where, pattern, cause in CAUSES:
        if re.search(pattern, test if where == "id" else errors):
            return cause
    first = next((line.strip() for line in message.splitlines() if line.strip()), "")
    if not first:  # the last `E   ` line of the traceback
        errors = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
        first = errors[0] if errors else "(no message)"
    first = re.sub(r"0x[0-9a-f]+|/tmp/\S+|pytest-\d+", "…", first)
    return first[:200]


def _collection_errors(log_text: str) -> list[str]:
    return sorted(set(re.findall(r"^ERROR (?:collecting )?(\S+\.py)", log_text, re.M)))


def run_pytest_stage(checkout: Path, tests_root: Path, stage: Stage, cards: int, out: Path, timeout: int,
                     keyword: str | None) -> list[Outcome]:
    log = out / f"{stage.name}.log"
    log.unlink(missing_ok=True)
    # the CI image (Gaudi software 1.18) ran in lazy mode unless a stage said otherwise; today's default is eager
    stage_env = {"PT_HPU_LAZY_MODE": "1", **stage.env}
    env = _environment(cards, {k: str(checkout / v) if v.startswith("tests/") else v for k, v in stage_env.items()})
    files = [str(tests_root.parent / f) for f in stage.files]  # the stage names them from the checkout root
    extra = ["-k", keyword] if keyword else []
    if stage.standalone is None:
        _pytest(checkout, [*files, *stage.args, *extra], env, out / f"{stage.name}.xml", timeout, log)
        return _read_junit(out / f"{stage.name}.xml")
    # run_standalone_tests.sh: collect the marked tests, then run each alone with --hpus N
    listed = subprocess.run(
        [str(PYTHON), "-m", "pytest", *files, "-q", "--collect-only", "-p", "no:cacheprovider", "--pythonwarnings",
         "ignore", "-m", stage.standalone, *extra], cwd=checkout, env=env, capture_output=True, text=True, check=False)
    ids = [line.strip() for line in listed.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    outcomes: list[Outcome] = []
    for index, test in enumerate(ids):
        junit = out / f"{stage.name}-{index}.xml"
        _pytest(checkout, [test, "--hpus", str(stage.hpus), "--pythonwarnings", "ignore"], env, junit, timeout, log)
        outcomes += _read_junit(junit)
    return outcomes


def plain_stage(checkout: Path, tests_root: Path, cards: int, out: Path, timeout: int,
                keyword: str | None) -> tuple[list[Outcome], list[str]]:
    log = out / "plain.log"
    log.unlink(missing_ok=True)
    extra = ["-k", keyword] if keyword else []
    _pytest(checkout, [str(tests_root), *extra], _environment(cards), out / "plain.xml", timeout, log)
    return _read_junit(out / "plain.xml"), _collection_errors(log.read_text(encoding="utf-8"))


# -- ported copy -------------------------------------------------------------------------------------------------------
def ported_tests(checkout: Path, out: Path) -> Path:
    """A copy of the plugin's tests/ (under out/ported/tests) with imports and patch targets renamed to hpu_nb's."""
    target = out / "ported" / "tests"
    shutil.rmtree(target.parent, ignore_errors=True)
    shutil.copytree(checkout / "tests", target)
    for path in target.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        new = re.sub(r"^(\s*)from (lightning_habana[\w.]*) import ([^\n(]+)$", _ported_import, text, flags=re.M)
        for old, replacement in PORTED_PATCH_TARGETS.items():
            new = new.replace(f'"{old}"', f'"{replacement}"')
        if new != text:
            path.write_text(new, encoding="utf-8")
    return target


def _ported_import(match: re.Match[str]) -> str:
    indent, module, names = match.group(1), match.group(2), match.group(3)
    comment = ""
    if "#" in names:
        names, comment = names.split("#", 1)
        comment = "  #" + comment
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    home = next((new for old, new in _PORTED_MODULES.items() if module == old or module.startswith(old + ".")), None)
    if home is None or "quant_config" in module:
        return match.group(0)
    lines = []
    for name in wanted:
        if name == "device_count":
            lines.append(f"{indent}from hpu_nb import HPUAccelerator as _A; device_count = _A.auto_device_count")
        elif name in _PORTED_NAMES_FROM_UTILS:
            lines.append(f"{indent}from hpu_nb.lightning_habana_utils import {name}")
        elif _exports(home, name):
            lines.append(f"{indent}from {home} import {name}")
        else:  # a name hpu_nb has no equal of under its own modules (HPU_AVAILABLE): the plugin's path, served
            lines.append(f"{indent}from {module} import {name}")
    return "\n".join(lines) + comment


def _exports(module: str, name: str) -> bool:
    sys.path.insert(0, str(ROOT))
    import importlib

    return hasattr(importlib.import_module(module), name)


# -- examples ------------------------------------------------------------------------------------------------------
def write_standins(folder: Path) -> list[str]:
    """What the examples download, stood in for in `folder/data` (their cwd): returns what was stood in."""
    sys.path.insert(0, str(ROOT))
    import torch

    mnist = folder / "data" / "MNIST" / "complete"
    mnist.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    # Lightning's MNISTDataModule keeps 5000 training images for validation (val_split); hpu_graphs.py's batch is 200
    for name, count in (("training.pt", 6600), ("test.pt", 600)):
        # MNIST-like: about a fifth of the pixels inked, intensities in [0, 1] (uniform noise over every pixel drives an
        # untrained net's log-softmax to exact zeros, which hpu_graphs.py's dynamic-ops step does not expect)
        inked = torch.rand(count, 28, 28, generator=generator) < 0.19
        images = torch.rand(count, 28, 28, generator=generator) * inked
        labels = torch.randint(0, 10, (count,), generator=generator)
        torch.save((images, labels), mnist / name)
    words = [f"w{i}" for i in range(200)]
    lines = [" ".join(words[(i * 7 + j) % len(words)] for j in range(20)) for i in range(400)]
    (folder / "data" / "wikitext-2.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return ["MNIST (Lightning's demo MNISTDataModule downloads it): 6600 / 600 random sparse 28x28 images in [0, 1],"
            " random labels,"
            " read by Lightning's own mocked-MNIST path (PL_USE_MOCKED_MNIST=1)",
            "WikiText-2 (Lightning's demo WikiText2 downloads it): 400 lines of 20 words from a 200-word vocabulary"]


def run_examples(checkout: Path, cards: int, out: Path, timeout: int, only: str | None) -> list[Outcome]:
    work = out / "examples-cwd"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for note in write_standins(work):
        print(f"  stand-in: {note}")
    outcomes = []
    examples = checkout / "examples"
    for name, args, env in EXAMPLES:
        if only and not re.search(only, name):
            continue
        script, *rest = args
        environment = _environment(cards, {"PT_HPU_LAZY_MODE": "1", **env})  # lazy: the CI image's default
        environment["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(examples)])  # the yml adds examples/ too
        log = out / f"example-{name}.log"
        started = time.monotonic()
        try:
            done = subprocess.run([str(PYTHON), str(examples / script), *rest], cwd=work, env=environment,
                                  capture_output=True, text=True, timeout=timeout, check=False)
            text, code = done.stdout + done.stderr, done.returncode
        except subprocess.TimeoutExpired as err:
            text, code = f"{err.stdout or ''}{err.stderr or ''}\n(timed out after {timeout} s)", -1
        log.write_text(text if isinstance(text, str) else str(text), encoding="utf-8")
        lines = [line for line in str(text).splitlines() if line.strip()]
        cause = "" if code == 0 else (next((ln for ln in reversed(lines) if "Error" in ln), lines[-1] if lines else ""))
        outcomes.append(Outcome(f"examples/{' '.join(args)}", "passed" if code == 0 else "failed", cause[:200]))
        print(f"  {name}: {'ran' if code == 0 else 'FAILED'} in {time.monotonic() - started:.0f} s")
    return outcomes


def setup() -> None:
    """.venv-lightning-habana over .venv: the base's packages through a .pth, every base package pinned."""
    sys.path.insert(0, str(ROOT / ".ci"))
    import layered_venv

    python = layered_venv.create_layer(str(BASE_PYTHON), VENV)
    # $TORCH_CPU_INDEX (torch's CPU index, as .ci/cpu_torch.py takes it) where given: torchvision's CPU build
    cpu_index = os.environ.get("TORCH_CPU_INDEX")
    index = ["--extra-index-url", cpu_index, "torchvision"] if cpu_index else []
    subprocess.run([str(python), "-m", "pip", "install", "-q", "-c", str(VENV / "constraints.txt"), *index,
                    *LAYER_PACKAGES], check=True)


# -- report --------------------------------------------------------------------------------------------------------
def report(name: str, outcomes: list[Outcome], collection_errors: list[str] | None = None) -> dict[str, object]:
    counts = collections.Counter(o.result for o in outcomes)
    print(f"\n== {name}: {counts['passed']} passed, {counts['failed']} failed, {counts['error']} errors, "
          f"{counts['skipped']} skipped, {counts['xfailed']} xfailed ({len(outcomes)} tests)")
    for module in collection_errors or []:
        print(f"   collection error: {module}")
    causes = collections.defaultdict(list)
    for outcome in outcomes:
        if outcome.result in ("failed", "error"):
            causes[outcome.cause].append(outcome.test)
    for cause, tests in sorted(causes.items(), key=lambda item: -len(item[1])):
        print(f"   {len(tests):3d} x {cause}")
        for test in tests[:6]:
            print(f"         {test}")
        if len(tests) > 6:
            print(f"         ... and {len(tests) - 6} more")
    return {"counts": dict(counts), "collection_errors": collection_errors or [],
            "failures": {cause: tests for cause, tests in causes.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path, help="a work tree of Lightning-AI/lightning-Habana")
    parser.add_argument("--mode", choices=("as-written", "ported"), default="as-written")
    parser.add_argument("--stages", nargs="+", choices=("plain", "ci", "examples"), default=["plain"])
    parser.add_argument("--cards", type=int, default=2, help="emulated cards on the machine (HPU_NB_DEVICE_COUNT)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/lightning_habana_suite"))
    parser.add_argument("--timeout", type=int, default=900, help="seconds per test (pytest-timeout) or example")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression (a subset, for a quick look)")
    parser.add_argument("--setup", action="store_true",
                        help=f"make {VENV.name} first (.venv plus {', '.join(LAYER_PACKAGES)}: the plugin's CI's)")
    options = parser.parse_args(argv)
    global PYTHON
    if options.setup:
        setup()
        PYTHON = VENV / "bin" / "python"
    checkout = options.checkout.resolve()
    if not (checkout / "tests" / "conftest.py").is_file() or not (checkout / "pyproject.toml").is_file():
        parser.error(f"{checkout} is not a lightning-habana work tree (no tests/conftest.py / pyproject.toml)")
    if (checkout / "src" / "lightning_habana").is_dir() and str(checkout / "src") in sys.path:
        parser.error("the plugin's src/ is on sys.path: its lightning_habana would be imported instead of hpu_nb's")
    out = options.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    tests_root = checkout / "tests"
    if options.mode == "ported":
        tests_root = ported_tests(checkout, out)
        # the conftest's `from tests import ...` and pyproject's rootdir: run the copy from its own root
        shutil.copy2(checkout / "pyproject.toml", tests_root.parent / "pyproject.toml")
        checkout_for_run = tests_root.parent
    else:
        checkout_for_run = checkout
    if {"plain", "ci"} & set(options.stages) and not (checkout_for_run / "data" / "MNIST").exists():
        # where Lightning's MNISTDataModule (data_dir "./data", the tests' cwd) would have downloaded it
        for note in write_standins(checkout_for_run):
            print(f"  stand-in, in {checkout_for_run / 'data'}: {note}")
    print(f"lightning-habana suite ({options.mode}) from {checkout} on {options.cards} emulated cards; logs in {out}")
    summary: dict[str, object] = {"mode": options.mode, "checkout": str(checkout), "cards": options.cards}
    if "plain" in options.stages:
        outcomes, errors = plain_stage(checkout_for_run, tests_root, options.cards, out, options.timeout,
                                       options.keyword)
        summary["plain"] = report("plain pytest", outcomes, errors)
    if "ci" in options.stages:
        for stage in STAGES:
            outcomes = run_pytest_stage(checkout_for_run, tests_root, stage, options.cards, out, options.timeout,
                                        options.keyword)
            summary[stage.name] = report(f"ci stage {stage.name}", outcomes)
    if "examples" in options.stages:
        summary["examples"] = report("examples", run_examples(checkout, options.cards, out, options.timeout,
                                                               options.keyword))
    (out / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    print(f"\nsummary: {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

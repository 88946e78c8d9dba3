"""Plain transformers 5 and accelerate on the emulated Gaudi, as Gaudi users write them now that optimum-habana is
end-of-support: no optimum, no hpu_nb import, the libraries find the `hpu` themselves.

- transformers: `is_torch_hpu_available()` (habana_frameworks importable, `torch.hpu.is_available()`), then
  `TrainingArguments.device` is `hpu:0` and `torch_compile=True` picks `backend="hpu_backend"`.
- accelerate: `accelerate launch --num_processes 2` starts two ranks (LOCAL_RANK set); `AcceleratorState` then asks
  `is_hpu_available(init_hccl=True)`, which imports `habana_frameworks.torch.distributed.hccl`, and picks
  DistributedType.MULTI_HPU over backend "hccl" (the emulated HCCL). Its `gather` sends a flat
  `all_gather_into_tensor` for every backend but gloo, which `Trainer.evaluate()` uses to gather the ranks' losses.

Every model is a tiny Llama built from a config with random weights, trained on random tokens (HF_HUB_OFFLINE=1:
nothing is downloaded). The scripts (tests/third_party/transformers_*.py, accelerate_two_cards.py) run in the
interpreter HPU_NB_TRANSFORMERS_PYTHON names: `make test` sets up `.venv-transformers`, the `transformers` extra
layered over `.venv` (.ci/layered_venv.py), because transformers in `.venv` would slow every Lightning process of the
suite (torchmetrics imports it) and optimum-habana's layer pins transformers 4.55. Without it they run in this
interpreter, and the tests skip, saying so, where transformers 5 and accelerate are not installed in either.

The last test runs the transformers section of notebooks/07_gaudi_code_from_elsewhere.ipynb: the notebook's kernel
(`.venv`) has no transformers, so the notebook shows the script and runs it only where transformers is importable;
this test runs it in the layered environment.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.layered_envs import installed_versions, layer_python

ROOT = Path(__file__).resolve().parents[2]
THIRD_PARTY = Path(__file__).parents[1] / "third_party"
NOTEBOOK = ROOT / "notebooks" / "07_gaudi_code_from_elsewhere.ipynb"


def transformers_python() -> str:
    """The interpreter the scripts run in: HPU_NB_TRANSFORMERS_PYTHON where it exists, else this one."""
    return layer_python("HPU_NB_TRANSFORMERS_PYTHON")


def versions() -> dict[str, str | None]:
    """transformers' and accelerate's versions in that interpreter (None: not installed)."""
    return installed_versions(transformers_python(), ("transformers", "accelerate"))


def _missing() -> str | None:
    found = versions()
    if found["transformers"] is None or int(found["transformers"].split(".")[0]) < 5:
        return f"transformers 5 is not installed (found {found['transformers']})"
    if found["accelerate"] is None:
        return "accelerate is not installed"
    return None


pytestmark = [
    pytest.mark.skipif(
        _missing() is not None,
        reason=f"{_missing()}: `make test` sets up .venv-transformers with transformers 5 and accelerate"
               " (`make transformers-env`); in your own environment, pip install 'hpu_nb[transformers]'",
    ),
]


def script_env(python: str, home: Path, lazy: bool | None) -> dict[str, str]:
    """The environment of a user's shell: an activated venv, the Gaudi's execution mode (None: the release's
    default), nothing of hpu_nb's tests."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPU_NB_", "PT_HPU_", "HABANA_", "PYTHONPATH"))}
    if lazy is not None:
        env["PT_HPU_LAZY_MODE"] = "1" if lazy else "0"
    env["PATH"] = os.pathsep.join([str(Path(python).parent), env.get("PATH", "")])
    env["HF_HUB_OFFLINE"] = "1"  # nothing is downloaded: every model here is built from a config
    env["HF_HOME"] = str(home)  # no user's accelerate config (~/.cache/huggingface/accelerate) changes the launch
    env["TOKENIZERS_PARALLELISM"] = "false"
    return env


def run_script(script: Path, *args: str, lazy: bool, cwd: Path, timeout: int = 180) -> dict[str, Any]:
    """Run a script in a fresh interpreter of the transformers environment; its last stdout line is its JSON result."""
    python = transformers_python()
    result = subprocess.run([python, str(script), *args], env=script_env(python, cwd / "hf", lazy), cwd=cwd,
                            capture_output=True, text=True, timeout=timeout, check=False)
    assert result.returncode == 0, f"{script.name} failed:\n{result.stdout[-2000:]}\n{result.stderr[-6000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def trainer_run(tmp_path_factory):
    """transformers_trainer.py's result for (lazy, compile), each run once for the module."""
    done: dict[tuple[bool, bool], dict[str, Any]] = {}

    def run(lazy: bool, compile: bool) -> dict[str, Any]:
        if (lazy, compile) not in done:
            out = tmp_path_factory.mktemp("trainer")
            args = ["--steps", "30", "--output-dir", str(out / "trainer"), *(["--compile"] if compile else [])]
            done[lazy, compile] = run_script(THIRD_PARTY / "transformers_trainer.py", *args, lazy=lazy, cwd=out)
        return done[lazy, compile]

    return run


def learned(losses: list[float], factor: float) -> bool:
    """The mean of the last quarter of the losses is below `factor` times the mean of the first quarter."""
    quarter = max(1, len(losses) // 4)
    return sum(losses[-quarter:]) / quarter < factor * sum(losses[:quarter]) / quarter


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_trainer_picks_hpu_by_itself_and_trains_a_tiny_llama_in_bf16(trainer_run, lazy):
    result = trainer_run(lazy, False)
    assert result["hpu_available"] is True
    assert result["args_device"] == "hpu:0" and result["parameter_device"] == "hpu:0"
    # bf16=True: float32 master weights, the forward under bf16 autocast
    assert result["parameter_dtype"] == "torch.float32" and result["computed_in"] == ["torch.bfloat16"]
    assert result["compiled"] is False and result["attn_implementation"] == "sdpa"
    losses = result["losses"]
    assert len(losses) == 30 and learned(losses, 0.6), losses
    # the emulated device counts the model's memory: ~90 k float32 parameters and AdamW's two moments (~1.1 MB)
    assert all(m > 1_000_000 for m in result["memory_in_use"]) and result["max_in_use"] > result["memory_in_use"][-1]


def test_trainer_with_torch_compile_and_sdpa_attention_trains_as_eager(trainer_run):
    """torch_compile=True, Gaudi's default execution mode (eager + torch.compile): transformers picks hpu_backend, and
    the SDPA attention is traced into the graphs with no graph break."""
    compiled = trainer_run(False, True)
    assert compiled["args_device"] == "hpu:0" and compiled["parameter_device"] == "hpu:0"
    assert compiled["compiled"] is True and compiled["compile_backend"] == "hpu_backend"
    assert compiled["attn_implementation"] == "sdpa" and compiled["computed_in"] == ["torch.bfloat16"]
    assert compiled["graphs"] >= 1 and compiled["graph_breaks"] == {}
    assert learned(compiled["losses"], 0.6), compiled["losses"]
    # the same training as without compile, to bf16's rounding
    eager = trainer_run(False, False)
    assert compiled["losses"] == pytest.approx(eager["losses"], rel=2e-2)


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_greedy_generate_on_hpu_gives_the_cpus_tokens(tmp_path, lazy):
    result = run_script(THIRD_PARTY / "transformers_generate.py", lazy=lazy, cwd=tmp_path)
    assert result["hpu_available"] is True and result["device"] == "hpu:0"
    assert result["new_tokens"] == 16
    assert result["hpu"] == result["cpu"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(300)
def test_accelerate_launch_on_two_cards_trains_gathers_and_evaluates(tmp_path):
    python = transformers_python()
    launcher = Path(python).parent / "accelerate"
    launch = [str(launcher)] if launcher.is_file() else [python, "-m", "accelerate.commands.accelerate_cli"]
    command = [*launch, "launch", "--num_processes", "2", "--main_process_port", str(free_port()),
               str(THIRD_PARTY / "accelerate_two_cards.py"), str(tmp_path)]
    done = subprocess.run(command, env=script_env(python, tmp_path / "hf", lazy=False), cwd=tmp_path,
                          capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, f"accelerate launch failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, result in enumerate(ranks):
        assert result["rank"] == rank and result["num_processes"] == 2
        assert result["multi_hpu"] is True, result["distributed_type"]
        assert result["backend"] == "hccl" and result["process_group_backend"] == "hccl"
        assert result["device"].startswith("hpu")
        # the accelerate loop: DDP's gradient all-reduce keeps the ranks' weights equal, and they trained
        assert result["loop_weights_equal"] is True and result["loop_weights_moved"] is True
        # gather of a 2-D tensor: (2, 3) per rank -> (4, 3), rank 0's rows first, on the device
        assert result["gathered_2d"] == [[0, 1, 2], [3, 4, 5], [100, 101, 102], [103, 104, 105]]
        assert result["gathered_2d_device"].startswith("hpu")
        # transformers.Trainer on both cards: distributed, equal weights after training, and evaluate() gathers the
        # ranks' losses into the loss of the whole evaluation set (16 sequences, 8 per rank)
        assert result["trainer_device"].startswith("hpu") and result["trainer_world_size"] == 2
        assert result["trainer_parallel_mode"] == "ParallelMode.DISTRIBUTED"
        assert result["trainer_weights_equal"] is True
        assert result["eval_loss"] == pytest.approx(result["eval_loss_by_hand"], rel=1e-2)
    assert ranks[0]["loop_losses"] == ranks[1]["loop_losses"]  # gathered, so the same on both ranks
    assert ranks[0]["eval_loss"] == ranks[1]["eval_loss"]


def notebook_script() -> str:
    """The script notebook 07 writes with `%%writefile {script}`: the cell's source without its magic line."""
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    cell = next(s for s in sources if s.startswith("%%writefile {script}\n"))
    return cell.split("\n", 1)[1]


def test_the_tutorials_trainer_script_trains_on_hpu(tmp_path):
    """Notebook 07's transformers section, run where transformers is installed, as its run cell runs it: a fresh
    interpreter, in the execution mode the user's environment sets (none here: the release's default)."""
    script = tmp_path / "train_tiny_llama.py"
    script.write_text(notebook_script())
    python = transformers_python()
    env = script_env(python, tmp_path / "hf", lazy=None)
    done = subprocess.run([python, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180,
                          check=False)
    assert done.returncode == 0, f"the notebook's script failed:\n{done.stdout[-2000:]}\n{done.stderr[-6000:]}"
    lines = done.stdout.strip().splitlines()[-3:]
    assert lines[0] == "is_torch_hpu_available(): True | Trainer's device: hpu:0", lines
    losses = [float(x) for x in re.findall(r"\d+\.\d+", lines[1].split(":", 1)[1])]
    assert len(losses) == 4 and losses[-1] < 0.8 * losses[0], lines[1]
    in_use, at_most = (float(x) for x in re.findall(r"(\d+\.\d+) MiB", lines[2]))
    assert 0.5 < in_use <= at_most, lines[2]

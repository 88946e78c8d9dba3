"""Gaudi code written by others runs unchanged on the emulated Gaudi.

Each script under tests/third_party/ is written as its authors' users write Gaudi code, and runs in its own interpreter
so that the import order is the script's own (Habana's examples import habana_frameworks before torch) and nothing of
pytest's process (hpu_nb imported, its fixtures) leaks in:
- a Habana Model-References-style training script (htcore first, mark_step, HPU graphs for eval in lazy mode);
- lightning-habana's examples/pytorch/hpu_graphs.py flows, rewritten with hpu_nb's imports on synthetic data;
- Hugging Face optimum-habana 1.21.2: GaudiTrainer on a tiny random Llama (fused AdamW, fused clip-norm, bf16
  autocast; eager and lazy) and on GPT-2 and BERT (lazy), and generation with HPU graphs against plain transformers
  on the CPU.

The optimum-habana scripts run in the interpreter HPU_NB_OPTIMUM_PYTHON names: `make test` sets up `.venv-optimum`, the
`optimum` extra layered over `.venv` (.ci/layered_venv.py), so that transformers stays out of every other Lightning
process of the suite. Without it they run in this interpreter, and the tests skip, saying so, where optimum-habana is
not installed in either. Two things stand in for what a Gaudi machine has, both only in those subprocesses:
- PATH starts with the interpreter's bin directory, as in an activated venv: optimum-habana reads the Gaudi software
  version at import with the shell command `pip list | grep habana-torch-plugin`, which must find this venv's pip.
- torchvision: optimum-habana's `adapt_transformers_to_gaudi()` imports GLM-4V's tokenizer, which does
  `from torchvision import transforms` at import. torchvision's PyPI wheels for torch 2.13 link CUDA torch and do not
  import beside the CPU build installed here (PyTorch's own CPU wheel index is out of reach), so where no importable
  torchvision is installed, tests/third_party/torchvision_standin is put on PYTHONPATH: a package that makes that one
  import succeed and fails loudly on any use. Nothing these tests run uses torchvision.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.layered_envs import installed_versions, layer_python

THIRD_PARTY = Path(__file__).parents[1] / "third_party"
TORCHVISION_STANDIN = THIRD_PARTY / "torchvision_standin"
OPTIMUM_HABANA = "1.21.2"


def optimum_python() -> str:
    """The interpreter optimum-habana's scripts run in: HPU_NB_OPTIMUM_PYTHON where it exists, else this one."""
    return layer_python("HPU_NB_OPTIMUM_PYTHON")


def optimum_versions() -> dict[str, str | None]:
    """optimum-habana's and transformers' versions in that interpreter (None: not installed)."""
    return installed_versions(optimum_python(), ("optimum-habana", "transformers"))


needs_optimum_habana = pytest.mark.skipif(
    optimum_versions()["optimum-habana"] is None,
    reason="optimum-habana is not installed: `make test` sets up .venv-optimum with it (`make optimum-env`); in your"
           " own environment, pip install 'hpu_nb[optimum]'",
)


def intel_transformer_engine_installed() -> bool:
    """What accelerate asks before fp8 training on HPU: the module `intel_transformer_engine` and its distribution
    (Gaudi software 1.19+ ships it behind hpex.experimental.transformer_engine)."""
    try:
        importlib.metadata.version("intel-transformer-engine")
        return importlib.util.find_spec("intel_transformer_engine") is not None
    except (importlib.metadata.PackageNotFoundError, ImportError, ValueError):
        return False


@functools.cache
def torchvision_imports(python: str) -> bool:
    """Whether a real torchvision is installed and imports beside torch there (asked in a fresh interpreter)."""
    probe = subprocess.run([python, "-c", "import torchvision.transforms"], capture_output=True, timeout=120,
                           check=False)
    return probe.returncode == 0


def run_script(script: str, *args: str, lazy: bool, cwd: Path, torchvision_standin: bool = False,
               timeout: int = 300, python: str = sys.executable) -> dict[str, Any]:
    """Run a script of tests/third_party in a fresh interpreter, in the given execution mode; its last stdout line
    is its JSON result."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPU_NB_", "PT_HPU_", "HABANA_"))}
    env["PT_HPU_LAZY_MODE"] = "1" if lazy else "0"
    env["PATH"] = os.pathsep.join([str(Path(python).parent), env.get("PATH", "")])  # an activated venv
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["HF_HUB_OFFLINE"] = "1"  # nothing is downloaded: every model here is built from a config
    if torchvision_standin and not torchvision_imports(python):
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TORCHVISION_STANDIN), env.get("PYTHONPATH")]))
    result = subprocess.run([python, str(THIRD_PARTY / script), *args], env=env, cwd=cwd, capture_output=True,
                            text=True, timeout=timeout, check=False)
    assert result.returncode == 0, f"{script} failed:\n{result.stdout[-2000:]}\n{result.stderr[-6000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def learned(losses: list[float], factor: float) -> bool:
    """The mean of the last quarter of the losses is below `factor` times the mean of the first quarter."""
    quarter = max(1, len(losses) // 4)
    return sum(losses[-quarter:]) / quarter < factor * sum(losses[:quarter]) / quarter


# -- Habana's Model-References ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("lazy", [True, False], ids=["lazy", "eager"])
def test_a_model_references_script_that_imports_habana_first_trains_and_evaluates(tmp_path, lazy):
    script = THIRD_PARTY / "model_references_hello.py"
    assert script.read_text().splitlines()[0].startswith("import habana_frameworks.torch.core as htcore")
    result = run_script(script.name, "--epochs", "3", lazy=lazy, cwd=tmp_path)
    assert result["lazy"] is lazy and result["device"] == "hpu:0"
    assert result["graphed"] is lazy  # evaluation went through wrap_in_hpu_graph in lazy mode only
    assert len(result["losses"]) == 3 and result["losses"][-1] < 0.6 * result["losses"][0]
    assert result["test_acc"] > 0.9


# -- lightning-habana's examples/pytorch/hpu_graphs.py ---------------------------------------------------------------
def test_lightning_habana_hpu_graphs_flows_train_and_test_as_without_graphs(tmp_path):
    result = run_script("lightning_hpu_graphs.py", lazy=True, cwd=tmp_path)
    assert result.pop("lazy") is True
    baseline = result["automatic"]["losses"]
    assert len(baseline) == 10 and learned(baseline, 0.5)
    # Graphs change how a step is run, not what it computes: the same losses as the model without graphs.
    for flow in ("capture_and_replay_train", "make_graphed_callables", "modulecacher", "dynamic_ops"):
        assert result[flow]["losses"] == pytest.approx(baseline, rel=1e-5), flow
    # Python control flow picks one of two cached graphs per step: another model, which learns too.
    branching = result["dynamic_control_flow"]["losses"]
    assert len(branching) == 10 and learned(branching, 0.6)
    for flow in ("capture_and_replay_test", "wrap_in_hpu_graph"):
        assert len(result[flow]["accuracies"]) == 4, flow
        assert result[flow]["accuracies"] == pytest.approx(result[flow]["reference"]), flow


# -- Hugging Face optimum-habana -------------------------------------------------------------------------------------
@needs_optimum_habana
def test_the_optimum_habana_under_test_is_the_pinned_one():
    versions = optimum_versions()
    assert versions["optimum-habana"] == OPTIMUM_HABANA
    assert versions["transformers"] is not None and versions["transformers"].startswith("4.55.")


@pytest.mark.skipif(optimum_python() == sys.executable,
                    reason="optimum-habana's scripts run in this interpreter (HPU_NB_OPTIMUM_PYTHON names no other)")
def test_the_optimum_layer_runs_this_torch_and_hpu_nb_and_keeps_transformers_out_of_here():
    """.venv-optimum (`make optimum-env`) runs the base environment's torch, Lightning and hpu_nb, and adds
    transformers; the base has none, so its Lightning processes do not import transformers at start-up."""
    probe = ("import sys, torch, lightning.pytorch, hpu_nb; "
             "print(torch.__file__, lightning.__file__, hpu_nb.__file__, 'transformers' in sys.modules)")

    def ask(python: str, code: str) -> list[str]:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=180, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.split()

    here = ask(sys.executable, probe)
    there = ask(optimum_python(), probe + "; import transformers; print(transformers.__file__)")
    assert here[:3] == there[:3]  # the same torch, Lightning and hpu_nb
    assert here[3] == "False"  # Lightning (through torchmetrics) found no transformers to import here
    assert not Path(there[4]).is_relative_to(sys.prefix)  # transformers lives in the layer, not in this environment


def assert_trained_the_habana_way(result: dict[str, Any], model_class: str, lazy: bool) -> None:
    assert result["model_class"] == model_class
    assert result["device"] == "hpu:0"
    assert result["optimizer"] == "habana_frameworks.torch.hpex.optimizers.FusedAdamW.FusedAdamW"
    assert result["clip_norm"] == "habana_frameworks.torch.hpex.normalization.FusedClipNorm.FusedClipNorm"
    # Every optimizer step was FusedAdamW's, and every gradient clipping FusedClipNorm's (one per step).
    assert result["steps_by"] == {"habana_frameworks.torch.hpex.optimizers.FusedAdamW.FusedAdamW": 20}
    assert result["clip_norm_calls"] == 20
    assert result["autocast_dtypes"] == ["torch.bfloat16"]  # use_torch_autocast: the linear layers ran in bf16
    if lazy:  # optimum-habana's lazy-mode path marks steps (the emulated Gaudi counts them)
        assert result["mark_steps"] >= 2 * 20
    else:
        assert result["mark_steps"] == 0
    assert len(result["losses"]) == 20


@pytest.fixture(scope="module")
def gaudi_trainer_runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, Any]]:
    """optimum_train.py per mode, run once: Llama in eager mode; Llama, GPT-2, BERT (and Llama in fp8 where it can
    run) in one lazy-mode process."""
    runs: dict[str, dict[str, Any]] = {}

    def run(mode: str) -> dict[str, Any]:
        if mode not in runs:
            models = ["llama"] if mode == "eager" else ["llama", "gpt2", "bert"]
            if mode == "lazy" and intel_transformer_engine_installed():
                models.append("llama_fp8")
            runs[mode] = run_script("optimum_train.py", mode, *models, lazy=mode == "lazy",
                                    cwd=tmp_path_factory.mktemp(mode), torchvision_standin=True,
                                    python=optimum_python())
        return runs[mode]

    return run


@needs_optimum_habana
@pytest.mark.parametrize("mode", ["eager", "lazy"])
def test_gaudi_trainer_trains_a_tiny_llama_with_habanas_fused_adamw_and_clip_norm(gaudi_trainer_runs, mode):
    result = gaudi_trainer_runs(mode)["llama"]
    assert_trained_the_habana_way(
        result, "optimum.habana.transformers.models.llama.modeling_llama.GaudiLlamaForCausalLM", lazy=mode == "lazy")
    assert learned(result["losses"], 0.85)


@needs_optimum_habana
def test_gaudi_trainer_trains_tiny_gpt2_and_bert_in_lazy_mode(gaudi_trainer_runs):
    result = gaudi_trainer_runs("lazy")
    assert_trained_the_habana_way(
        result["gpt2"], "optimum.habana.transformers.models.gpt2.modeling_gpt2.GaudiGPT2LMHeadModel", lazy=True)
    assert learned(result["gpt2"]["losses"], 0.85)
    # optimum-habana keeps transformers' BERT class (it patches functions, not this class)
    assert_trained_the_habana_way(
        result["bert"], "transformers.models.bert.modeling_bert.BertForSequenceClassification", lazy=True)
    assert learned(result["bert"]["losses"], 0.5)


@needs_optimum_habana
def test_gaudi_trainer_trains_in_fp8_with_habanas_transformer_engine(gaudi_trainer_runs):
    if not intel_transformer_engine_installed():
        pytest.skip("fp8=True needs `intel_transformer_engine` and its distribution metadata (accelerate's fp8 check"
                    " on HPU); the emulated Gaudi does not provide them yet")
    result = gaudi_trainer_runs("lazy")
    fp8, bf16 = result["llama_fp8"], result["llama"]
    assert fp8["mixed_precision"] == "fp8"
    assert fp8["te_linears"] == 15 and fp8["plain_linears"] == 0  # accelerate put te.Linear in place of every Linear
    assert fp8["steps_by"] == bf16["steps_by"] and fp8["clip_norm_calls"] == 20
    # fp8 rounding changes the numbers a little, not the learning.
    assert fp8["losses"] != bf16["losses"] and fp8["losses"] == pytest.approx(bf16["losses"], rel=0.05)
    assert learned(fp8["losses"], 0.85)


@needs_optimum_habana
def test_generation_with_hpu_graphs_gives_plain_transformers_tokens(tmp_path):
    result = run_script("optimum_llama_generate.py", lazy=True, cwd=tmp_path, torchvision_standin=True,
                        python=optimum_python())
    assert result["model_class"] == "optimum.habana.transformers.models.llama.modeling_llama.GaudiLlamaForCausalLM"
    assert result["graph_wrapped"] is True
    reference = result["reference"]
    assert len(reference[0]) == 6 + 10
    for name in ("default", "flash"):
        assert result["outputs"][name]["device"] == "hpu:0", name
        assert result["outputs"][name]["tokens"] == reference, name  # greedy: the same tokens, token for token
    assert result["outputs"]["flash"]["fused_sdpa_calls"] > 0  # use_flash_attention went through Habana's FusedSDPA

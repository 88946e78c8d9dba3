"""lightning-habana's examples (examples/pytorch/*.py, examples/fabric/*), rewritten with hpu_nb's imports under
tests/plugin_examples/, run as a user runs them: `python <script>` on the emulated Gaudi, synthetic data in place of
the downloads, small sizes. Its hpu_graphs.py flows run in tests/third_party/test_third_party_gaudi_code.py.

Each example prints "RESULT {json}" lines; the tests check them against what the example must do, with plain torch on
the CPU as the reference where a number can be recomputed.

The plugin's own example files, unchanged, run at the end: their import lines always (hpu_nb's copy of those lines),
the whole examples from a lightning-habana checkout when $LIGHTNING_HABANA_CHECKOUT names one (skipped otherwise: the
plugin's code is never vendored here), through tools/run_plugin_suite.py's examples stage.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "tests" / "plugin_examples"
TIMEOUT = 300
BF16_RESOLUTION = 2.0**-7  # relative spacing of bfloat16 numbers



def run_example(script: str, *args: str, cwd: Path, env: dict[str, str] | None = None) -> list[dict]:
    """`python tests/plugin_examples/<script> args` in `cwd` on the emulated Gaudi; the RESULT records it printed."""
    full_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("HPU_NB_", "PT_HPU_", "HABANA_", "HLS_", "DS_", "DEEPSPEED", "LOWER_LIST",
                                     "FP32_LIST")) and k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT")}
    full_env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(EXAMPLES)])
    full_env.update(env or {})
    done = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True,
                          timeout=TIMEOUT - 20, env=full_env, cwd=str(cwd), check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads(line[len("RESULT "):]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]


# -- examples/pytorch/mnist_trainer.py (with mnist_sample.py) ----------------------------------------------------------
@pytest.mark.timeout(TIMEOUT)
def test_mnist_trainer_runs_every_feature(tmp_path):
    op_lists = {"PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST": str(EXAMPLES / "ops_lower_mnist.txt"),
                "PT_HPU_AUTOCAST_FP32_OPS_LIST": str(EXAMPLES / "ops_fp32_mnist.txt")}
    run_types = ["basic", "autocast", "HPUPrecisionPlugin", "MixedPrecisionPlugin", "recipe_caching", "fp8_training"]
    results = {r["run_type"]: r for r in run_example("mnist_trainer.py", "-r", *run_types, cwd=tmp_path, env=op_lists)}
    assert list(results) == run_types

    fp32 = results["basic"]["metrics"]["train_loss"]
    assert fp32 == pytest.approx(math.log(10), abs=0.1)  # a fresh 10-class classifier
    assert results["recipe_caching"]["metrics"]["train_loss"] == fp32  # the recipe cache changes no number
    bf16 = [results[name]["metrics"]["train_loss"] for name in ("autocast", "HPUPrecisionPlugin",
                                                                 "MixedPrecisionPlugin")]
    assert bf16[0] == bf16[1] == bf16[2]  # the same bf16 autocast, however it is asked for
    assert bf16[0] == pytest.approx(fp32, rel=BF16_RESOLUTION)  # the fp32 run is the reference
    assert results["autocast"]["override_checks"] >= 1  # mm ran in float32 and tan in bfloat16: the files applied
    assert "torch.nn.modules.linear.Linear" in results["basic"]["layers"]
    assert "torch.nn.modules.linear.Linear" not in results["fp8_training"]["layers"]  # replaced by fp8 layers
    assert results["fp8_training"]["metrics"]["train_loss"] == pytest.approx(fp32, rel=0.05)


@pytest.mark.timeout(TIMEOUT)
def test_mnist_trainer_fp8_inference_measures_then_quantizes(tmp_path):
    """Measure, then quantize the same model, in one process, as the plugin's example does."""
    (result,) = run_example("mnist_trainer.py", "-r", "fp8_inference", cwd=tmp_path)
    assert any(layer.endswith(".Fp8QuantLinear") for layer in result["layers"]), result["layers"]
    assert "torch.nn.modules.linear.Linear" not in result["layers"]
    assert 0.0 <= result["metrics"]["test_acc"] <= 1.0  # the quantized model ran the test loop


# -- examples/pytorch/language_model.py ------------------------------------------------------------------------------
@pytest.mark.timeout(2 * TIMEOUT)
@pytest.mark.parametrize(("strategy", "expected", "steps"), [("FULL_SHARD", "HPUFSDPStrategy", 1),
                                                             ("DDP", "HPUDDPStrategy", 8)])
def test_language_model_trains_on_two_cards(tmp_path, strategy, expected, steps):
    (result,) = run_example("language_model.py", "--small", "-d", "2", "-s", strategy, cwd=tmp_path)
    assert result["strategy"] == expected and result["world_size"] == 2
    assert result["global_step"] == steps  # fast_dev_run: 1 (FSDP) / 10 batches, of which each rank has 8 (DDP)
    assert result["peak_bytes"] > 0
    assert result["train_loss"] == pytest.approx(math.log(64), abs=1.0)  # near uniform over a 64-token vocabulary


# -- examples/fabric/image_classifier/train_fabric.py ----------------------------------------------------------------
@pytest.mark.timeout(TIMEOUT)
def test_fabric_image_classifier_trains_on_hpu_and_tests_as_plain_torch(tmp_path):
    (result,) = run_example("train_fabric.py", "--epochs", "2", "--train-samples", "256", "--test-samples", "64",
                            "--batch-size", "32", "--save-model", cwd=tmp_path)
    assert result["device"] == result["param_device"] == "hpu:0"
    assert result["epoch"] == 2 and result["lr"] == pytest.approx(1.0 * 0.7**2)  # StepLR, once per epoch
    assert len(result["losses"]) == 16 and all(math.isfinite(loss) for loss in result["losses"])

    # the saved weights, evaluated by plain torch on the CPU, give the example's test loss and accuracy
    sys.path.insert(0, str(EXAMPLES))
    try:
        from synthetic import mnist_like
        from train_fabric import Net
    finally:
        sys.path.remove(str(EXAMPLES))
    saved = torch.load(tmp_path / "mnist_cnn.pt", map_location="cpu", weights_only=False)
    net = Net()
    net.load_state_dict({k: v.cpu() for k, v in saved["model"].items()})
    net.eval()
    images, labels = mnist_like(64, seed=2).tensors
    with torch.no_grad():
        output = net(images)
    loss = torch.nn.functional.nll_loss(output, labels, reduction="sum").item() / 64
    assert result["test_loss"] == pytest.approx(loss, rel=1e-4)
    assert result["accuracy"] == pytest.approx((output.argmax(1) == labels).float().mean().item())


# -- the plugin's own examples, unchanged ----------------------------------------------------------------------------
# The import lines of lightning-habana's examples at 5549fa927d55 (examples/pytorch/mnist_trainer.py, hpu_graphs.py,
# language_model.py, examples/fabric/image_classifier/train_fabric.py), as their users run them: hpu_nb serves the
# `lightning_habana` paths. (train_fabric.py's torchvision import is left out: torchvision is not installed here.)
PLUGIN_EXAMPLE_IMPORTS = (
    "import habana_frameworks.torch.core as htcore",
    "import habana_frameworks.torch as htorch",
    "from lightning_habana import HPUAccelerator, HPUDDPStrategy, HPUPrecisionPlugin, SingleHPUStrategy",
    "from lightning_habana.pytorch import HPUAccelerator, HPUDDPStrategy, SingleHPUStrategy",
    "from lightning_habana.pytorch.accelerator import HPUAccelerator",
    "from lightning_habana.pytorch.plugins import HPUFSDPPrecision, HPUPrecisionPlugin",
    "from lightning_habana.pytorch.strategies import HPUDDPStrategy, HPUFSDPStrategy",
    "from lightning_habana.utils.imports import _LIGHTNING_GREATER_EQUAL_2_3_0",
    "from lightning_habana.fabric.accelerator import HPUAccelerator",
    "from lightning_habana.fabric.strategies.single import SingleHPUStrategy",
)
CHECKOUT_ENV = "LIGHTNING_HABANA_CHECKOUT"  # a work tree of Lightning-AI/lightning-Habana, for the test below


@pytest.mark.timeout(TIMEOUT)
def test_the_plugins_example_import_lines_run_as_written(tmp_path):
    """Each import line of the plugin's examples, in a fresh interpreter started outside the repository, as a user's
    script starts (language_model.py's `utils.imports` line failed before hpu_nb served that module)."""
    script = "\n".join([*PLUGIN_EXAMPLE_IMPORTS, "import hpu_nb, hpu_nb.fabric",
                        "assert HPUPrecisionPlugin is hpu_nb.HPUPrecisionPlugin and _LIGHTNING_GREATER_EQUAL_2_3_0",
                        "assert SingleHPUStrategy is hpu_nb.fabric.SingleHPUStrategy",
                        "print('RESULT', '{\"imported\": %d}' % " + str(len(PLUGIN_EXAMPLE_IMPORTS)) + ")"])
    (tmp_path / "imports.py").write_text(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPU_NB_", "PT_HPU_"))}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "imports.py"], capture_output=True, text=True, timeout=TIMEOUT - 20,
                          env=env, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    assert f'RESULT {{"imported": {len(PLUGIN_EXAMPLE_IMPORTS)}}}' in done.stdout


@pytest.mark.timeout(3600)
def test_the_plugins_own_examples_run_unchanged_from_a_checkout(tmp_path):
    """The plugin's CI commands for its examples (its .azure/hpu-tests.yml), each with its own arguments, on the
    emulated Gaudi, their downloads stood in for: tools/run_plugin_suite.py's examples stage. The examples are the
    plugin's, not hpu_nb's: they are read from a checkout named by $LIGHTNING_HABANA_CHECKOUT, never copied here."""
    checkout = os.environ.get(CHECKOUT_ENV)
    if not checkout or not (Path(checkout) / "examples" / "pytorch" / "mnist_trainer.py").is_file():
        pytest.skip(f"no lightning-habana checkout: set {CHECKOUT_ENV} to a work tree of Lightning-AI/lightning-Habana"
                    " (e.g. at 5549fa927d55) to run its examples unchanged")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPU_NB_", "PT_HPU_"))}
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "run_plugin_suite.py"), checkout, "--stages",
                           "examples", "--out", str(tmp_path), "--timeout", "1200"], capture_output=True, text=True,
                          env=env, timeout=3500, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads((tmp_path / "summary.json").read_text())["examples"]
    assert summary["counts"] == {"passed": 5}, (summary, done.stdout[-4000:])

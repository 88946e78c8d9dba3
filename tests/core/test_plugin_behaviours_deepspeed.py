"""lightning-habana's behaviours, second round: DeepSpeed accumulation and inference, offload / optimizer checks,
HPUDataModule's shuffling on a Gaudi, and the `hpu_backend` registration.

Each test is rewritten from one of the plugin's (its behaviour, not its code). DeepSpeed runs are subprocesses
(tests/plugin_behaviours_scripts/): DeepSpeed initialises torch.distributed, which must not leak into this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.utilities.exceptions import MisconfigurationException

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "plugin_behaviours_scripts"
RUN_TIMEOUT = 240


def run_script(name: str, *args: str) -> dict:
    """Run a scenario script in a clean environment; returns the JSON it prints after 'RESULT '."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HPU_NB_", "DS_", "DEEPSPEED", "PT_HPU_", "HLS_", "HABANA_"))
           and k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR")}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run([sys.executable, str(SCRIPTS / name), *args], capture_output=True, text=True,
                            timeout=RUN_TIMEOUT - 10, env=env, cwd=str(ROOT), check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(line for line in reversed(result.stdout.splitlines()) if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


# -- 1. DeepSpeed gradient accumulation ------------------------------------------------------------------------------
def reference_losses(first_lr: float | None) -> list[float]:
    """The plugin's test_lightning_model in plain torch: 8 micro-batches of 2, accumulate 2 (DeepSpeed scales each
    micro-batch's loss by 1/2), AdamW, DeepSpeed's WarmupDecayLR(0.02 -> 0.05 over 4 steps, total 2). The k-th
    optimizer step runs at the warm-up's lr for iteration max(k - 1, 0): the scheduler steps after each optimizer
    step; since DeepSpeed's PR #6597 its constructor sets iteration -1's lr (the minimum). `first_lr`: the lr of the
    first step when the constructor left the optimizer's own in place (DeepSpeed <= 0.14)."""
    weights = [torch.nn.Parameter(torch.ones(10)) for _ in range(4)]
    optimizer = torch.optim.AdamW(weights)
    x, y = torch.ones(2, 10), torch.zeros(2, 10)
    losses, steps = [], 0
    for micro_batch in range(8):
        out = x
        for w in weights:
            out = out * w
        loss = torch.sum(torch.abs(y - out)) / (2 * 10 * 50)
        losses.append(loss.item())
        (loss / 2).backward()
        if micro_batch % 2 == 1:
            iteration = max(steps - 1, 0)
            lr = 0.02 + 0.03 * min(iteration, 4) / 4 if iteration < 4 else 0.02
            for group in optimizer.param_groups:
                group["lr"] = first_lr if (steps == 0 and first_lr is not None) else lr
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
    return losses


@pytest.mark.timeout(2 * RUN_TIMEOUT)
def test_deepspeed_accumulation_is_lightnings_own():
    """accumulate_grad_batches=2 with train_micro_batch_size_per_gpu=2: one optimizer step per 2 micro-batches, as
    Lightning's own DeepSpeedStrategy (CPU accelerator) takes on the same config and model, and as plain torch."""
    ours = run_script("ds_accumulation.py", "--flavour", "hpu_nb")
    lightning = run_script("ds_accumulation.py", "--flavour", "lightning-cpu")
    assert ours["gradient_accumulation_steps"] == 2 and ours["engine_steps"] == 4
    assert ours["optimizer_steps_before"] == lightning["optimizer_steps_before"] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert ours["losses"] == pytest.approx(lightning["losses"], rel=1e-6)
    assert ours["losses"] == pytest.approx(reference_losses(first_lr=None), rel=1e-5)
    assert ours["final_loss"] == pytest.approx(0.01509, abs=1e-5)  # not the plugin's 0.0164: see the next test


@pytest.mark.timeout(RUN_TIMEOUT)
def test_the_plugins_expected_loss_came_from_deepspeed_0_14s_warmup():
    """The plugin's 0.0164 (+-4e-4) is the same 4 steps with DeepSpeed 0.14's WarmupDecayLR (Habana's fork 1.18, the
    plugin's CI), whose first step ran at AdamW's own lr (1e-3): the step count was never different."""
    old = run_script("ds_accumulation.py", "--flavour", "hpu_nb", "--deepspeed-0.14-schedulers")
    assert old["optimizer_steps_before"] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert old["final_loss"] == pytest.approx(0.0164, abs=4e-4)  # the plugin's assertion
    assert old["losses"] == pytest.approx(reference_losses(first_lr=1e-3), rel=1e-5)
    two_steps_only = reference_losses(first_lr=None)[4]  # the loss after two steps (0.02, 0.02): not the plugin's
    assert two_steps_only == pytest.approx(0.01696, abs=1e-4)


# -- 2. DeepSpeed inference engine with a mixed precision ------------------------------------------------------------
@pytest.mark.timeout(3 * RUN_TIMEOUT)
@pytest.mark.parametrize(("given_as", "dtype"), [("kwargs", "float32"), ("config", "float32"), ("kwargs", "float16")])
def test_bf16_mixed_with_init_inference_runs_in_autocast(given_as, dtype):
    """HPUDeepSpeedPrecisionPlugin("bf16-mixed") with init_inference(dtype=...): the engine keeps its weights in
    `dtype`; inputs are not cast to bf16 (that failed in addmv) but the forward runs in bf16 autocast, as
    HPUPrecisionPlugin's: x * (x @ w) four times on ones gives 2, 8, 128, 32768 (exact in bf16)."""
    report = run_script("ds_inference_mixed.py", given_as, dtype)
    assert report["engine"] == "InferenceEngine"
    assert report["weights_dtype"] == f"torch.{dtype}"
    assert report["preds"] == [[32768.0, 32768.0]]
    assert report["pred_dtype"] == "torch.bfloat16"  # computed in autocast, not in the weights' float32


@pytest.mark.timeout(RUN_TIMEOUT)
def test_bf16_true_with_init_inference_casts_inputs_to_the_engines_dtype():
    report = run_script("ds_inference_mixed.py", "config", "float32", "bf16-true")
    assert report["weights_dtype"] == "torch.float32" and report["pred_dtype"] == "torch.float32"
    assert report["preds"] == [[32768.0, 32768.0]]


def test_mixed_precision_plugin_in_the_inference_engine_autocasts_and_keeps_inputs():
    from hpu_nb.core.strategies.deepspeed import HPUDeepSpeedPrecisionPlugin

    plugin = HPUDeepSpeedPrecisionPlugin("bf16-mixed")
    x = torch.ones(2, 3)
    assert plugin.convert_input(x).dtype == torch.bfloat16  # DeepSpeed's training engine: bf16 weights
    plugin.use_inference_engine(torch.float32)
    assert plugin.convert_input(x) is x
    w = torch.randn(3, 4, device="hpu")
    with plugin.forward_context():
        out = x.to("hpu") @ w
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float().cpu(), (x.bfloat16() @ w.cpu().bfloat16()).float())
    plugin.use_inference_engine(None)
    with plugin.forward_context():
        assert (x.to("hpu") @ w).dtype == torch.float32


# -- 3. offload with ZeRO stage 0; configure_optimizers returning None -----------------------------------------------
@pytest.mark.parametrize("given_as", ["arguments", "config"])
def test_offload_optimizer_with_stage_0_warns_and_is_ignored(given_as):
    """The plugin ran ZeRO stage 0 with an offload_optimizer setting (its test_lightning_model's cpu_offload cases):
    DeepSpeed cannot offload at stage 0, so hpu_nb says so and drops the setting instead of refusing the run."""
    from hpu_nb.core.strategies.deepspeed import HPUDeepSpeedStrategy

    if given_as == "arguments":
        kwargs = {"stage": 0, "offload_optimizer": True}
    else:
        kwargs = {"config": {"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}},
                             "train_micro_batch_size_per_gpu": 2}}
    with pytest.warns(UserWarning, match="stage is 0: the optimizer stays on the device"):
        strategy = HPUDeepSpeedStrategy(**kwargs)
    assert strategy.config["zero_optimization"]["stage"] == 0
    assert "offload_optimizer" not in strategy.config["zero_optimization"]


def test_offload_optimizer_without_zero_warns():
    from hpu_nb.core.strategies.deepspeed import HPUDeepSpeedStrategy

    with pytest.warns(UserWarning, match="offload_optimizer=True is ignored"):
        HPUDeepSpeedStrategy(zero_optimization=False, offload_optimizer=True)


@pytest.mark.timeout(RUN_TIMEOUT)
def test_configure_optimizers_returning_none_is_a_misconfiguration(tmp_path):
    """The plugin's test_hpu_deepspeed_with_invalid_optimizer: Lightning's MisconfigurationException naming the
    cause, not an IndexError from inside DeepSpeed. In-process with one device, DeepSpeed stops before
    initialising torch.distributed's engine state (the error comes first)."""
    report = run_script("ds_no_optimizer.py")
    assert report["error"] == "MisconfigurationException"
    assert "You have specified an invalid optimizer to be run with deepspeed" in report["message"]
    assert "configure_optimizers() returned None" in report["message"]


def test_no_optimizer_check_passes_a_real_optimizer_through():
    from hpu_nb.core.strategies.deepspeed import HPUDeepSpeedStrategy

    strategy = HPUDeepSpeedStrategy(stage=2)
    trainer = L.Trainer(accelerator="hpu", devices=1, strategy=strategy, logger=False)
    model = BoringModel()
    model.trainer = trainer
    strategy._lightning_module = model
    optimizer, scheduler = strategy._init_optimizers()
    assert isinstance(optimizer, torch.optim.SGD) and scheduler is not None
    model.configure_optimizers = lambda: None
    with pytest.raises(MisconfigurationException, match="configure_optimizers\\(\\) returned None"):
        strategy._init_optimizers()


# -- 4. HPUDataModule shuffles its training data on a Gaudi ------------------------------------------------------------
class _StandInTransform:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def __call__(self, image):
        return image


@pytest.fixture
def imagenet_folders(monkeypatch):
    """torchvision's names HPUDataModule uses (torchvision cannot be installed beside this torch): transforms, Compose,
    and an ImageFolder (root, transform, imgs) whose sample i is the number i."""
    import types

    from torch.utils.data import Dataset

    transforms = types.ModuleType("torchvision.transforms")
    for name in ("RandomResizedCrop", "RandomHorizontalFlip", "ToTensor", "Normalize", "Resize", "CenterCrop"):
        setattr(transforms, name, type(name, (_StandInTransform,), {}))

    class Compose(_StandInTransform):
        def __init__(self, steps) -> None:
            self.transforms = list(steps)

    class ImageFolder(Dataset):
        def __init__(self, root: str, transform=None) -> None:
            self.root, self.transform = root, transform
            self.imgs = [(f"{root}/{i}.JPEG", 0) for i in range(40)]

        def __len__(self) -> int:
            return len(self.imgs)

        def __getitem__(self, index: int):
            return torch.tensor(index), 0

    transforms.Compose = Compose
    datasets = types.ModuleType("torchvision.datasets")
    datasets.ImageFolder = ImageFolder
    package = types.ModuleType("torchvision")
    package.transforms, package.datasets = transforms, datasets
    for name, module in (("torchvision", package), ("torchvision.transforms", transforms),
                         ("torchvision.datasets", datasets)):
        monkeypatch.setitem(sys.modules, name, module)
    return package


def _epoch(loader) -> list[int]:
    return [int(i) for batch in loader for i in batch[0]]


@pytest.mark.parametrize(("generation", "release", "kind"),
                         [("GAUDI2", "1.22.0", "media"), ("GAUDI", "1.21.0", "aeon"), ("GAUDI3", "1.22.0", "torch")])
def test_imagenet_training_data_is_shuffled_on_a_gaudi(make_fake_gaudi, imagenet_folders, generation, release, kind):
    """The plugin handed Habana's loader shuffle=False beside a RandomSampler: its Gaudi2 media pipe ignores samplers
    and took the keyword, so training data came in folder order every epoch. Now each epoch is a new permutation of
    all samples, on every Gaudi's loader; validation stays in folder order."""
    from hpu_nb import HPUDataModule

    make_fake_gaudi(device_name=generation, release=release)
    import habana_dataloader

    dm = HPUDataModule(train_dir="/data/ILSVRC2012/train", val_dir="/data/ILSVRC2012/val", batch_size=8)
    dm.setup("fit")
    train, val = dm.train_dataloader(), dm.val_dataloader()
    assert isinstance(train, habana_dataloader.HabanaDataLoader) and train.kind == val.kind == kind
    first, second = _epoch(train), _epoch(train)
    assert sorted(first) == sorted(second) == list(range(40))
    assert first != list(range(40)) and second != first  # shuffled, and reshuffled each epoch
    assert _epoch(val) == list(range(40))


def test_the_fake_media_loader_ignores_the_sampler_when_shuffle_is_given(make_fake_gaudi, imagenet_folders):
    """What the plugin's arguments did on a Gaudi2 (the fake models the bridge's ResnetDataLoader): shuffle=False with
    a RandomSampler reads in folder order; without the keyword the RandomSampler turns the pipe's shuffling on."""
    from torch.utils.data import RandomSampler

    make_fake_gaudi(device_name="GAUDI2")
    import habana_dataloader

    folder = imagenet_folders.datasets.ImageFolder("/data/imagenet/train")
    arguments = {"dataset": folder, "batch_size": 8, "num_workers": 8, "pin_memory": True, "drop_last": True,
                 "sampler": RandomSampler(folder)}
    plugin_style = habana_dataloader.HabanaDataLoader(shuffle=False, **arguments)
    assert plugin_style.kind == "media" and plugin_style.shuffle is False
    assert _epoch(plugin_style) == list(range(40))
    assert habana_dataloader.HabanaDataLoader(**arguments).shuffle is True


def test_supplied_datasets_follow_the_seeded_sampler_on_a_gaudi(make_fake_gaudi):
    """A non-folder dataset goes to torch's DataLoader inside Habana's loader, which follows the sampler: the same
    seeded order as on the emulated Gaudi."""
    from torch.utils.data import TensorDataset

    from hpu_nb import HPUDataModule

    def order(**kwargs) -> list[int]:
        dm = HPUDataModule(train_dataset=TensorDataset(torch.arange(20)), val_dataset=TensorDataset(torch.arange(4)),
                           batch_size=4, seed=3, **kwargs)
        dm.setup("fit")
        return _epoch(dm.train_dataloader())

    emulated = order()
    make_fake_gaudi(device_name="GAUDI2")
    on_gaudi = order()
    assert on_gaudi == emulated and sorted(on_gaudi) == list(range(20)) and on_gaudi != list(range(20))


# -- 5. torch.compile's hpu_backend next to Habana's software; the fake does what the bridge does ---------------------
COMPILE_FIRST = """
import torch
from torch._dynamo.backends import registry

def f(x):
    return torch.sin(x) * 2 + x

compiled = torch.compile(f, backend="hpu_backend")  # torch looks the name up now: hpu_nb's entry point
import habana_frameworks.torch.core as htcore  # Habana's @register_backend runs (or ran): no duplicate name
x = torch.randn(8, device="hpu")
y = compiled(x)
fake = __import__("habana_frameworks._fake", fromlist=["STATE"]).STATE
print("RESULT", __import__("json").dumps({
    "module": registry._COMPILER_FNS["hpu_backend"].__module__, "lazy": htcore.is_lazy(),
    "close": bool(torch.allclose(y.cpu(), f(x.cpu()))),
    "habana_compiled": fake.calls.count("habana_frameworks.torch.dynamo.compile_backend.hpu_backend")}))
"""


@pytest.mark.timeout(2 * RUN_TIMEOUT)
@pytest.mark.parametrize(("release", "env"), [("1.19.0", {}), ("1.22.0", {"PT_HPU_AUTOLOAD": "0"})])
def test_torch_compile_before_habanas_core_registers_habanas_backend_once(make_fake_gaudi, release, env):
    """torch.compile(backend="hpu_backend") before Habana's core is imported (lazy mode, or autoload off): torch loads
    hpu_nb's entry point, which must hand torch Habana's backend, not register its own for Habana's import to trip
    over ("duplicate name"); in lazy mode too Habana's backend compiles (no refusal: Habana registers it there)."""
    fake = make_fake_gaudi(release=release)
    run_env = fake.subprocess_env({k: v for k, v in os.environ.items() if not k.startswith(("PT_HPU_", "HPU_NB_"))})
    run_env.update(env)
    run_env["PYTHONPATH"] = run_env["PYTHONPATH"] + os.pathsep + str(ROOT)
    result = subprocess.run([sys.executable, "-c", COMPILE_FIRST], capture_output=True, text=True, env=run_env,
                            timeout=RUN_TIMEOUT - 10, cwd=str(ROOT), check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("RESULT "))
    report = json.loads(line[len("RESULT "):])
    assert report["module"] == "habana_frameworks.torch.dynamo.compile_backend"
    assert report["lazy"] is (release == "1.19.0")
    assert report["close"] and report["habana_compiled"] >= 1


def test_the_fake_refuses_a_second_hpu_backend_as_habana_does(monkeypatch, make_fake_gaudi):
    from torch._dynamo.backends import registry

    make_fake_gaudi()
    # what hpu_nb's entry point registered before Habana's import (undone after the fake is uninstalled)
    monkeypatch.setitem(registry._COMPILER_FNS, "hpu_backend", lambda gm, inputs: gm)
    with pytest.raises(AssertionError, match="duplicate name: hpu_backend"):
        import habana_frameworks.torch.core  # noqa: F401


def test_the_fake_registers_hpu_backend_in_lazy_mode(make_fake_gaudi, monkeypatch):
    from torch._dynamo.backends.registry import _COMPILER_FNS

    make_fake_gaudi(release="1.19.0")
    monkeypatch.delenv("PT_HPU_LAZY_MODE", raising=False)
    import habana_frameworks.torch.core as htcore

    assert htcore.is_lazy() and _COMPILER_FNS["hpu_backend"].__module__.startswith("habana_frameworks.torch.dynamo")


def test_the_emulated_gaudi_still_finds_its_own_backend():
    import torch

    from hpu_nb.emulator import graph_compiler
    from hpu_nb.runtime import compile_backend

    assert compile_backend.hpu_backend is graph_compiler.emulated_hpu_backend  # the entry point's target here
    compiled = torch.compile(lambda x: torch.cos(x) + 1, backend="hpu_backend")
    x = torch.randn(5, device="hpu")
    torch.testing.assert_close(compiled(x).cpu(), torch.cos(x.cpu()) + 1)


@pytest.mark.parametrize(
    ("visible", "module_id", "device", "expected"),
    [
        (None, None, 0, None),  # fewer than 8 cards, nothing named: index 0, the card acquired by type
        ("2,3", None, 1, "3"),  # HLS_MODULE_ID set to the visible module of that index
        ("2,3", "3", 0, "3"),  # a module chosen earlier is kept
    ],
)
def test_the_fakes_set_device_sets_hls_module_id_as_the_bridge(make_fake_gaudi, monkeypatch, visible, module_id,
                                                                device, expected):
    for name, value in (("HABANA_VISIBLE_MODULES", visible), ("HLS_MODULE_ID", module_id)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    make_fake_gaudi(device_count=2)
    import habana_frameworks.torch.hpu as hthpu

    hthpu.set_device(device)
    assert os.environ.get("HLS_MODULE_ID") == expected


def test_the_fakes_set_device_asserts_as_the_bridge(make_fake_gaudi, monkeypatch):
    monkeypatch.delenv("HABANA_VISIBLE_MODULES", raising=False)
    monkeypatch.delenv("HLS_MODULE_ID", raising=False)
    make_fake_gaudi(device_count=2)
    import habana_frameworks.torch.hpu as hthpu

    with pytest.raises(AssertionError, match="the only supported device idx is 0"):
        hthpu.set_device("hpu:1")
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "4,5")
    monkeypatch.setenv("HLS_MODULE_ID", "6")
    with pytest.raises(AssertionError, match="different from current_module_id=6"):
        hthpu.set_device(0)


def test_the_fakes_hccl_import_reads_the_mode_with_int(make_fake_gaudi, monkeypatch):
    make_fake_gaudi()
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "false")
    with pytest.raises(ValueError, match="invalid literal for int"):
        import habana_frameworks.torch.distributed.hccl  # noqa: F401


def test_the_fakes_op_list_reader_is_habanas_getline_not_hpu_nbs(make_fake_gaudi, monkeypatch, tmp_path):
    """Habana reads each line verbatim: a CRLF file's "mm\\r" and a comment line match no op (hpu_nb hands Habana a
    normalised copy for this reason); the fake must read so too, not through hpu_nb's reader."""
    listed = tmp_path / "lower.txt"
    listed.write_bytes(b"mm\r\n# matmuls\n\nadd\n")
    make_fake_gaudi(release="1.22.0")
    monkeypatch.setenv("PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST", str(listed))
    from habana_frameworks.torch.core import _autocast_lists

    assert _autocast_lists.LISTS.lower == {"mm\r", "# matmuls", "", "add"}
    assert _autocast_lists.LISTS.lower_source == str(listed)
    monkeypatch.setenv("PT_HPU_AUTOCAST_FP32_OPS_LIST", str(tmp_path / "missing.txt"))
    with pytest.warns(UserWarning, match="Failed to open file with ops to autocast"):
        ops, source = _autocast_lists.load_list("PT_HPU_AUTOCAST_FP32_OPS_LIST", {"default_op"})
    assert ops == {"default_op"} and source == "default"

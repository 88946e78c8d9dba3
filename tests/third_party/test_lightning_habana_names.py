"""`lightning_habana` as written (issue 27 item 2): where the archived plugin is not installed, its module paths give
hpu_nb's classes (hpu_nb/lightning_habana_names.py, found by the start-up finder of hpu_nb-habana.pth), the seed
documents' examples run with their imports exactly as printed, a real `lightning_habana` wins, HPU_NB_AUTOLOAD=0 turns
it off; and an hpu_nb piece of one Lightning flavour given to the other package's Trainer / Fabric names the import to
use.

The tests that start a fresh interpreter run it from a folder outside the repository, as
tests/runtime/test_first_line_import.py does, so what they find comes from the installed `.pth`, not from the checkout.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hpu_nb import lightning_habana_names as names

REPO = Path(__file__).resolve().parents[2]
SEEDS = REPO.parent / "shared" / "seeds"  # the lightning-habana documents this product grew from (where present)
TIMEOUT = 240

# The plugin's public module paths (its src/lightning_habana tree, less private and MediaPipe-only modules).
PLUGIN_MODULES = [
    "lightning_habana",
    "lightning_habana.pytorch",
    "lightning_habana.pytorch.accelerator",
    "lightning_habana.pytorch.strategies",
    "lightning_habana.pytorch.strategies.ddp",
    "lightning_habana.pytorch.strategies.deepspeed",
    "lightning_habana.pytorch.strategies.fsdp",
    "lightning_habana.pytorch.strategies.parallel",
    "lightning_habana.pytorch.strategies.single",
    "lightning_habana.pytorch.plugins",
    "lightning_habana.pytorch.plugins.precision",
    "lightning_habana.pytorch.plugins.deepspeed_precision",
    "lightning_habana.pytorch.plugins.fsdp_precision",
    "lightning_habana.pytorch.plugins.io_plugin",
    "lightning_habana.pytorch.profiler",
    "lightning_habana.pytorch.profiler.profiler",
    "lightning_habana.pytorch.datamodule",
    "lightning_habana.pytorch.datamodule.datamodule",
    "lightning_habana.fabric",
    "lightning_habana.fabric.accelerator",
    "lightning_habana.fabric.strategies",
    "lightning_habana.fabric.strategies.ddp",
    "lightning_habana.fabric.strategies.fsdp",
    "lightning_habana.fabric.strategies.parallel",
    "lightning_habana.fabric.strategies.single",
    "lightning_habana.fabric.plugins",
    "lightning_habana.fabric.plugins.precision",
    "lightning_habana.fabric.plugins.fsdp_precision",
    "lightning_habana.fabric.plugins.io_plugin",
    "lightning_habana.utils",
    "lightning_habana.utils.resources",
    "lightning_habana.utils.imports",
    "lightning_habana.utils.hpu_distributed",
    "lightning_habana.pytorch.plugins.quant_config",
    "lightning_habana.pytorch.plugins.quant_config.fp8",
]
# lightning_habana/__init__.py's __all__ (lightning-habana 1.7)
PLUGIN_TOP_LEVEL = {
    "HPUAccelerator", "HPUDDPStrategy", "HPUDeepSpeedStrategy", "HPUParallelStrategy", "HPUFSDPStrategy",
    "SingleHPUStrategy", "HPUPrecisionPlugin", "HPUCheckpointIO", "HPUDataModule", "HPUProfiler", "HPU_AVAILABLE",
    "HPUDeepSpeedPrecisionPlugin", "HPUFSDPPrecision",
}


def _environment(**changes: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HPU_NB_", "PT_HPU_", "PYTHONPATH", "HABANA_", "DS_", "LOWER_LIST", "FP32_LIST"))
           and k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])  # as in an activated venv
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _run(code: str, tmp_path: Path, **env: str | None) -> subprocess.CompletedProcess:
    """`python script.py` (the code written to a file: multi-process launchers run the script again) in `tmp_path`."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code))
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_environment(**env), capture_output=True,
                          text=True, timeout=TIMEOUT, check=False)


def _results(done: subprocess.CompletedProcess) -> list[dict]:
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads(line[len("RESULT "):]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]


# -- the table -------------------------------------------------------------------------------------------------------
def test_the_table_serves_every_public_module_path_of_the_plugin():
    assert sorted(names.MODULES) == sorted(PLUGIN_MODULES)
    assert set(names.exported_names("lightning_habana")) == PLUGIN_TOP_LEVEL
    assert set(names.exported_names("lightning_habana.pytorch")) == PLUGIN_TOP_LEVEL - {"HPU_AVAILABLE"}
    assert names.exported_names("lightning_habana.pytorch.plugins.precision")[0] == "HPUPrecisionPlugin"
    assert {"_PRECISION_INPUT", "is_fp8_available", "_INTEL_NEURAL_COMPRESSOR_AVAILABLE"} <= set(
        names.exported_names("lightning_habana.pytorch.plugins.precision"))
    assert names.exported_names("lightning_habana.utils") == []


def test_the_flavour_is_lightning_where_installed_else_pytorch_lightning(monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(names, "_flavour", None)
    assert names.flavour() == "lightning"
    monkeypatch.setattr(names, "_flavour", None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "lightning" else
                        real_find_spec(name, *a))
    assert names.flavour() == "standalone"


# -- fresh interpreters: the module paths --------------------------------------------------------------------------
def test_every_module_path_imports_and_its_names_are_hpu_nbs(tmp_path):
    result = _results(_run(
        f"""
        import importlib, json, sys
        import lightning_habana
        loaded_lightning = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "lightning",
                                                                               "pytorch_lightning"))
        import hpu_nb, hpu_nb.fabric
        from hpu_nb.core.accelerator import HPUAccelerator
        expected_utils = {{"device_count": HPUAccelerator.auto_device_count,
                           "is_fp8_available": HPUAccelerator.is_fp8_available,
                           "is_fp16_available": HPUAccelerator.is_fp16_available}}
        wrong, counted = [], 0
        from hpu_nb import lightning_habana_names as names, lightning_habana_utils as helpers
        for path in {PLUGIN_MODULES!r}:
            module = importlib.import_module(path)
            home = hpu_nb.fabric if ".fabric" in path else hpu_nb
            entries = dict(e.partition("=")[::2] for e in names.MODULES[path][1])
            for name in module.__all__:
                counted += 1
                value = getattr(module, name)
                if name == "HPU_AVAILABLE":
                    ok = value is HPUAccelerator.is_available()
                elif entries[name].startswith("utils:") or names.MODULES[path][0] == "utils":  # the plugin's helpers
                    ok = value is getattr(helpers, name)
                elif name in expected_utils:
                    ok = value is expected_utils[name]
                else:
                    ok = value is getattr(home, name)
                if not ok:
                    wrong.append(f"{{path}}.{{name}}")
        star = {{}}
        exec("from lightning_habana.pytorch.strategies import *", star)
        # attribute access reaches submodules not yet imported, as the plugin's eager __init__ files allowed
        import lightning_habana as lh
        print("RESULT", json.dumps({{
            "lightning_loaded_by_import": loaded_lightning, "wrong": wrong, "counted": counted,
            "star": sorted(k for k in star if not k.startswith("__")),
            "attribute": lh.pytorch.plugins.io_plugin.HPUCheckpointIO is hpu_nb.HPUCheckpointIO,
            "marked": lh.__hpu_nb_names__, "no_file": not hasattr(lh, "__file__"),
        }}))
        """,
        tmp_path,
    ))[0]
    assert result["lightning_loaded_by_import"] == []  # `import lightning_habana` loads neither torch nor Lightning
    assert result["wrong"] == [] and result["counted"] > 60
    assert result["star"] == sorted(["HPUFSDPStrategy", "HPUDDPStrategy", "HPUDeepSpeedStrategy",
                                     "HPUParallelStrategy", "SingleHPUStrategy"])
    assert result["attribute"] is True and result["marked"] is True


def test_without_lightning_the_names_are_the_pytorch_lightning_flavours_and_train(tmp_path):
    """lightning-habana's order: `lightning` if installed, else `pytorch_lightning` (here `lightning` is hidden)."""
    result = _results(_run(
        """
        import sys
        sys.modules["lightning"] = None  # as if the `lightning` package were not installed
        import json
        import pytorch_lightning as pl
        from pytorch_lightning.demos.boring_classes import BoringModel
        from lightning_habana.pytorch.accelerator import HPUAccelerator
        from lightning_habana.pytorch.plugins import HPUPrecisionPlugin
        from lightning_habana.fabric import HPUPrecision
        import hpu_nb.lightning_fabric, hpu_nb.pytorch_lightning

        trainer = pl.Trainer(accelerator=HPUAccelerator(), devices=1,
                             plugins=[HPUPrecisionPlugin(precision="bf16-mixed")], max_steps=2, limit_val_batches=0,
                             logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False)
        trainer.fit(BoringModel())
        print("RESULT", json.dumps({
            "same": [HPUAccelerator is hpu_nb.pytorch_lightning.HPUAccelerator,
                     HPUPrecisionPlugin is hpu_nb.pytorch_lightning.HPUPrecisionPlugin,
                     HPUPrecision is hpu_nb.lightning_fabric.HPUPrecision],
            "steps": trainer.global_step, "device": str(trainer.strategy.root_device),
            "lightning": sorted(m for m in sys.modules if m.startswith("lightning.")),
        }))
        """,
        tmp_path,
    ))[0]
    assert result["same"] == [True, True, True]
    assert result["steps"] == 2 and result["device"].startswith("hpu")
    assert result["lightning"] == []


def test_a_real_lightning_habana_on_the_path_wins(tmp_path):
    site = tmp_path / "site"
    (site / "lightning_habana").mkdir(parents=True)
    (site / "lightning_habana" / "__init__.py").write_text("REAL = True\n")
    done = _run(
        """
        import lightning_habana
        print(lightning_habana.REAL, hasattr(lightning_habana, "__hpu_nb_names__"))
        try:
            import lightning_habana.pytorch.accelerator  # the real package's to give, and this one lacks it
        except ModuleNotFoundError as err:
            print(err.name)
        """,
        tmp_path,
        PYTHONPATH=str(site),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "False", "lightning_habana.pytorch"]


def test_on_a_gaudi_without_the_plugin_the_names_are_served_too(tmp_path):
    """With Habana's software on the path (here the test fake) the finder stays for `lightning_habana` alone."""
    from tests.fake_habana import SITE as FAKE_HABANA_SITE

    done = _run(
        f"""
        import lightning_habana, habana_frameworks
        print(lightning_habana.__hpu_nb_names__, habana_frameworks.__path__[0].startswith({FAKE_HABANA_SITE!r}))
        """,
        tmp_path,
        PYTHONPATH=FAKE_HABANA_SITE,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "True"]


def test_the_autoload_switch_leaves_lightning_habana_unfound(tmp_path):
    done = _run("import lightning_habana.pytorch.accelerator", tmp_path, HPU_NB_AUTOLOAD="0")
    assert done.returncode != 0
    assert "No module named 'lightning_habana'" in done.stderr


# -- the seed documents' examples, their imports exactly as printed --------------------------------------------------
# Stand-ins for what the documents leave to the reader (LitClassifier, MNISTDataModule, BoringModel, batch_size), and
# TINY: the few Trainer arguments that keep a run short. The snippets below are the documents' code with their import
# lines unchanged (test_every_lightning_habana_import_of_the_seeds_is_run checks that).
PREAMBLE = """
import glob, json, os, sys
import torch
import torch.nn as nn
import lightning

_reports = []

def report(**values):
    print("RESULT", json.dumps(values, default=str), flush=True)
    _reports.append(values)  # and in files, one per report of each process: the ranks share one stdout
    with open(f"result-{os.getpid()}-{len(_reports):04d}.json", "w") as out:
        json.dump(values, out, default=str)

class LitClassifier(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 32), nn.ReLU(), nn.Linear(32, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

class MNISTDataModule(lightning.LightningDataModule):
    def __init__(self, batch_size=32):
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self):
        gen = torch.Generator().manual_seed(0)
        data = torch.utils.data.TensorDataset(torch.rand(64, 1, 28, 28, generator=gen),
                                              torch.randint(0, 10, (64,), generator=gen))
        return torch.utils.data.DataLoader(data, batch_size=self.batch_size)

from lightning.pytorch.demos.boring_classes import BoringModel
batch_size = 16
TINY = dict(max_steps=2, limit_val_batches=0, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False)
"""

SEED_MIXED_PRECISION = """
from lightning import Trainer  # the document's context
# -- "Enable Mixed Precision"
from lightning_habana.pytorch.accelerator import HPUAccelerator

trainer = Trainer(devices=1, accelerator=HPUAccelerator(), precision="bf16-mixed", logger=False, **TINY)
trainer.fit(LitClassifier(), datamodule=MNISTDataModule(batch_size=batch_size))
report(name="precision flag", steps=trainer.global_step, strategy=type(trainer.strategy).__name__,
       plugin=type(trainer.precision_plugin).__name__, precision=trainer.precision_plugin.precision,
       device=trainer.strategy.root_device.type)

# -- "HPUPrecisionPlugin": an excerpt from an MNIST example
from lightning import Trainer
from lightning_habana.pytorch.accelerator import HPUAccelerator
from lightning_habana.pytorch.plugins.precision import HPUPrecisionPlugin

# Initialize a trainer with HPU accelerator for HPU strategy for single device,
# with HPU precision plugin for autocast
trainer = Trainer(
    accelerator=HPUAccelerator(),
    devices=1,
    plugins=[
        HPUPrecisionPlugin(
            precision="bf16-mixed",
        )
    ],
    logger=False, **TINY,
)

# Init our model
model = LitClassifier()
# Init the data
dm = MNISTDataModule(batch_size=batch_size)

# Train the model ⚡
trainer.fit(model, datamodule=dm)
import hpu_nb
report(name="plugin", steps=trainer.global_step, strategy=type(trainer.strategy).__name__,
       plugin=type(trainer.precision_plugin).__name__, precision=trainer.precision_plugin.precision,
       device=trainer.strategy.root_device.type, same=type(trainer.precision_plugin) is hpu_nb.HPUPrecisionPlugin)
"""

SEED_FP8_TRAINING = """
from lightning import Trainer
from lightning_habana.pytorch.accelerator import HPUAccelerator
from lightning_habana.pytorch.plugins.precision import HPUPrecisionPlugin
from habana_frameworks.torch.hpex.experimental.transformer_engine import recipe

model = BoringModel()

# init the precision plugin for fp8 training.
plugin = HPUPrecisionPlugin(precision="fp8")

# Replace torch.nn.Modules with transformer engine equivalent modules
plugin.convert_modules(model, replace_layers=True, recipe=recipe.DelayedScaling())

# Initialize a trainer with HPUPrecisionPlugin
trainer = Trainer(
    accelerator=HPUAccelerator(),
    plugins=plugin,
    logger=False, **TINY,
)

# Train the model ⚡
trainer.fit(model)
report(steps=trainer.global_step, layer=type(model.layer).__module__, precision=trainer.precision_plugin.precision)
"""

SEED_FP8_MEASUREMENT = """
from lightning import Trainer
from lightning_habana.pytorch.accelerator import HPUAccelerator
from lightning_habana.pytorch.plugins.precision import HPUPrecisionPlugin
from habana_frameworks.torch.hpex.experimental.transformer_engine import recipe

lightning.seed_everything(0)
model = BoringModel()

# init the precision plugin for fp8 inference.
plugin = HPUPrecisionPlugin(precision="fp8")

# Replace module for fp8 inference measurements
plugin.convert_modules(model, inference=True, quant=False)

# Initialize a trainer with HPUPrecisionPlugin
trainer = Trainer(
    accelerator=HPUAccelerator(),
    plugins=plugin,
    limit_test_batches=0.1,
    logger=False, enable_progress_bar=False, limit_predict_batches=4,
)

# Run inference and dump measurements ⚡
trainer.predict(model)
report(files=sorted(os.listdir(os.environ["HABANA_LOGS"])))
"""

# "Quantization" runs in a fresh process ("Measurement mode and Quantization mode cannot be run in single process"),
# after the measurement snippet's set-up (the document continues with its `plugin`, `model` and `trainer`).
SEED_FP8_QUANTIZATION = """
from lightning import Trainer
from lightning_habana.pytorch.accelerator import HPUAccelerator
from lightning_habana.pytorch.plugins.precision import HPUPrecisionPlugin

lightning.seed_everything(0)
model = BoringModel()
plugin = HPUPrecisionPlugin(precision="fp8")
trainer = Trainer(accelerator=HPUAccelerator(), plugins=plugin, limit_test_batches=0.1, logger=False,
                  enable_progress_bar=False, limit_predict_batches=4)
# -- "Quantization"
# Replace module for fp8 inference measurements
plugin.convert_modules(model, inference=True, quant=True)

# Run inference ⚡
out = trainer.predict(model)
report(batches=len(out), layer=type(model.layer).__name__, finite=all(bool(torch.isfinite(o).all()) for o in out))
"""

# The document imports `from lightning.callbacks import DeviceStatsMonitor`, a module Lightning never had (it is
# lightning.pytorch.callbacks): that line is the document's error, not lightning_habana's, and is corrected here.
SEED_DEVICE_STATS = """
from lightning import Trainer
from lightning.pytorch.callbacks import DeviceStatsMonitor
from lightning_habana.pytorch.accelerator import HPUAccelerator
from lightning.pytorch.loggers import CSVLogger

device_stats = DeviceStatsMonitor()
trainer = Trainer(accelerator=HPUAccelerator(), callbacks=[device_stats], log_every_n_steps=1,
                  logger=CSVLogger("."), **TINY)  # the logger Lightning picks where tensorboard is not installed
trainer.fit(BoringModel())
with open(os.path.join(trainer.logger.log_dir, "metrics.csv")) as logged:
    report(stats=sorted({key.split("/")[-1] for key in logged.readline().strip().split(",")
                         if key.startswith("DeviceStatsMonitor.on_train_batch_end/")}))
"""

SEED_PROFILER = """
# -- "Default Profiling"
from lightning import Trainer
from lightning_habana.pytorch.accelerator import HPUAccelerator
from lightning_habana.pytorch.profiler.profiler import HPUProfiler

trainer = Trainer(accelerator=HPUAccelerator(), profiler=HPUProfiler(), logger=False, default_root_dir="default",
                  **TINY)
trainer.fit(BoringModel())

# -- "Distributed Profiling"
from lightning import Trainer
from lightning_habana.pytorch.accelerator import HPUAccelerator
from lightning_habana.pytorch.profiler.profiler import HPUProfiler

profiler = HPUProfiler(filename="perf-logs")
trainer = Trainer(profiler=profiler, accelerator=HPUAccelerator(), logger=False, default_root_dir="distributed",
                  **TINY)
trainer.fit(BoringModel())

# -- "Custom Profiling" (the document's MyModel, made a whole LightningModule: it leaves out super().__init__())
from lightning import Trainer
from lightning_habana.pytorch.accelerator import HPUAccelerator
from lightning_habana.pytorch.profiler.profiler import HPUProfiler
from lightning import LightningModule

# Reference profiler in LightningModule
class MyModel(BoringModel):
    def __init__(self, profiler=None):
        super().__init__()
        self.profiler = profiler

# To profile in any part of your code, use the self.profiler.profile() function
    def custom_processing_step_basic(self, data):
        with self.profiler.profile("my_custom_action"):
            print("do somthing")
        return data

    def training_step(self, batch, batch_idx):
        return super().training_step(self.custom_processing_step_basic(batch), batch_idx)

# Pass profiler instance to LightningModule
profiler = HPUProfiler()
model = MyModel(profiler)
trainer = Trainer(accelerator=HPUAccelerator(), profiler=profiler, logger=False, default_root_dir="custom",
                  **{**TINY, "max_steps": 5})  # the profiler's schedule records steps 3 to 5
trainer.fit(model)
traces = {folder: sorted(glob.glob(f"{folder}/**/*.json", recursive=True))
          for folder in ("default", "distributed", "custom")}
report(traces={folder: [os.path.basename(p) for p in found] for folder, found in traces.items()},
       custom=any("my_custom_action" in open(p).read() for p in traces["custom"]))
"""

# ZeRO stages, offload and bf16 as the document builds them (it builds the Trainer only: 8 cards, no fit).
SEED_DEEPSPEED = """
results = {}
from lightning.pytorch import Trainer  # the document's context
# -- ZeRO-1
from lightning.pytorch.plugins import DeepSpeedPrecisionPlugin
from lightning_habana.pytorch.accelerator import HPUAccelerator
from lightning_habana.pytorch.strategies import HPUDeepSpeedStrategy

trainer = Trainer(devices=8, accelerator=HPUAccelerator(), strategy=HPUDeepSpeedStrategy(zero_optimization=True, stage=1), plugins=[DeepSpeedPrecisionPlugin(precision="bf16-mixed")])
results["ZeRO-1"] = trainer
# -- ZeRO-2
trainer = Trainer(devices=8, accelerator=HPUAccelerator(), strategy=HPUDeepSpeedStrategy(zero_optimization=True, stage=2), plugins=[DeepSpeedPrecisionPlugin(precision="bf16-mixed")])
results["ZeRO-2"] = trainer
# -- ZeRO-3
trainer = Trainer(devices=8, accelerator=HPUAccelerator(), strategy=HPUDeepSpeedStrategy(zero_optimization=True, stage=3), plugins=[DeepSpeedPrecisionPlugin(precision="bf16-mixed")])
results["ZeRO-3"] = trainer
# -- ZeRO-Offload (ZeRO-Infinity is the same line in the document)
trainer = Trainer(devices=8, accelerator=HPUAccelerator(), strategy=HPUDeepSpeedStrategy(zero_optimization=True, stage=2, offload_optimizer=True), plugins=[DeepSpeedPrecisionPlugin(precision="bf16-mixed")])
results["ZeRO-Offload"] = trainer
# -- BF16 precision
trainer = Trainer(devices=8, accelerator=HPUAccelerator(), strategy=HPUDeepSpeedStrategy(), plugins=[DeepSpeedPrecisionPlugin(precision="bf16-mixed")])
results["BF16"] = trainer
# -- Activation Checkpointing
from lightning.pytorch import LightningModule, Trainer
from lightning_habana.pytorch.accelerator import HPUAccelerator
from lightning_habana.pytorch.strategies import HPUDeepSpeedStrategy
from deepspeed.runtime.activation_checkpointing.checkpointing import checkpoint

class SampleModel(LightningModule):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(32)
        self.l2 = nn.Linear(32)

    def forward(self, x):
        l1_out = self.l1(x)
        l2_out = checkpoint(self.l2, l1_out)
        return l2_out

trainer = Trainer(accelerator=HPUAccelerator(),
                    strategy=HPUDeepSpeedStrategy(zero_optimization=True,
                                                    stage=3,
                                                    offload_optimizer=True,
                                                    cpu_checkpointing=True),
                    plugins=[DeepSpeedPrecisionPlugin(precision="bf16-mixed")]
                )
results["Activation Checkpointing"] = trainer
import hpu_nb
report(**{name: [type(t.strategy) is hpu_nb.HPUDeepSpeedStrategy, t.num_devices,
                 t.strategy.config["zero_optimization"]["stage"],
                 "offload_optimizer" in t.strategy.config["zero_optimization"]]
          for name, t in results.items()})
"""  # noqa: E501 -- the document's lines, as printed

# "BF16-Optimizer": the document's run, as printed (its config's train_batch_size of 8 = 2 per card x 2 accumulated x
# 2 cards: it is a two-card example; the stand-in SampleModel is BoringModel with the document's optimizer).
SEED_DEEPSPEED_BF16_OPTIMIZER = """
from lightning.pytorch import LightningModule, Trainer
from lightning_habana.pytorch.accelerator import HPUAccelerator
from lightning_habana.pytorch.strategies import HPUDeepSpeedStrategy
from lightning.pytorch.plugins import DeepSpeedPrecisionPlugin  # the document's earlier examples

config = {
    "train_batch_size": 8,
    "bf16": {
        "enabled": True
    },
    "fp16": {
        "enabled": False
    },
    "train_micro_batch_size_per_gpu": 2,
    "scheduler": {
        "type": "WarmupDecayLR",
        "params": {
        "warmup_min_lr": 0.02,
        "warmup_max_lr": 0.05,
        "warmup_num_steps": 4,
        "total_num_steps" : 8,
        "warmup_type": "linear"
        }
    },
    "zero_allow_untested_optimizer": True,
    "zero_optimization": {"stage" : 2}
}


class SampleModel(BoringModel):

    def configure_optimizers(self):
        from torch.optim.adamw import AdamW as AdamW
        optimizer = torch.optim.AdamW(self.parameters())
        return optimizer


_plugins = [DeepSpeedPrecisionPlugin(precision="bf16-mixed")]
_accumulate_grad_batches=2
_parallel_hpus = [torch.device("hpu")] * HPUAccelerator.auto_device_count()

model = SampleModel()
trainer = Trainer(
    accelerator=HPUAccelerator(), strategy=HPUDeepSpeedStrategy(config=config, parallel_devices=_parallel_hpus),
    enable_progress_bar=False,
    fast_dev_run=8,
    plugins=_plugins,
    use_distributed_sampler=False,
    limit_train_batches=16,
    accumulate_grad_batches=_accumulate_grad_batches,
)

trainer.fit(model)
report(rank=trainer.global_rank, world=trainer.world_size, steps=trainer.global_step,
       device=str(trainer.strategy.root_device))
"""

SEED_README = """
from lightning import Trainer
from lightning_habana.pytorch.accelerator import HPUAccelerator

# Run on one HPU.
trainer = Trainer(accelerator=HPUAccelerator(), devices=1)
one = trainer
# Run on multiple HPUs.
trainer = Trainer(accelerator=HPUAccelerator(), devices=8)
eight = trainer
# Choose the number of devices automatically.
trainer = Trainer(accelerator=HPUAccelerator(), devices="auto")
report(**{name: [type(t.strategy).__name__, t.num_devices] for name, t in
          (("1", one), ("8", eight), ("auto", trainer))})
"""

SEED_SNIPPETS = (SEED_MIXED_PRECISION, SEED_FP8_TRAINING, SEED_FP8_MEASUREMENT, SEED_FP8_QUANTIZATION,
                 SEED_DEVICE_STATS, SEED_PROFILER, SEED_DEEPSPEED, SEED_DEEPSPEED_BF16_OPTIMIZER, SEED_README)


def _seed(snippet: str, tmp_path: Path, **env: str | None) -> list[dict]:
    for earlier in tmp_path.glob("result-*.json"):  # a test may run two snippets in one folder
        earlier.unlink()
    done = _run(PREAMBLE + snippet, tmp_path, **env)
    assert done.returncode == 0, done.stderr[-4000:]
    # read from each process's file: the ranks of a multi-card example write to one pipe, where a rank's line can land
    # inside another's (a 2-card run once gave no RESULT line on stdout although both ranks finished)
    return [json.loads(path.read_text()) for path in sorted(tmp_path.glob("result-*.json"))]


def test_every_lightning_habana_import_of_the_seeds_is_run():
    """Each `from lightning_habana... import ...` line the seed documents print is one of the snippets run below."""
    if not SEEDS.is_dir():
        pytest.skip(f"no seed documents at {SEEDS}")
    printed = {line.strip() for seed in SEEDS.glob("*.txt") for line in seed.read_text().splitlines()
               if re.match(r"\s*from lightning_habana[.\w]* import ", line)}
    assert printed, "the seeds print lightning_habana imports"
    run = {line.strip() for snippet in SEED_SNIPPETS for line in snippet.splitlines()}
    assert printed <= run, printed - run


def test_seed_mixed_precision_examples(tmp_path):
    flag, plugin = _seed(SEED_MIXED_PRECISION, tmp_path)
    for result in (flag, plugin):
        assert result["steps"] == 2 and result["device"] == "hpu"
        assert (result["strategy"], result["plugin"], result["precision"]) == \
            ("SingleHPUStrategy", "HPUPrecisionPlugin", "bf16-mixed")
    assert plugin["same"] is True


def test_seed_fp8_training_example(tmp_path):
    (result,) = _seed(SEED_FP8_TRAINING, tmp_path)
    assert result["steps"] == 2 and result["precision"] == "fp8"
    assert "transformer_engine" in result["layer"]  # convert_modules(replace_layers=True) swapped the Linear


def test_seed_fp8_inference_examples_measure_then_quantize_in_a_fresh_process(tmp_path):
    logs = tmp_path / "habana_logs"
    logs.mkdir()
    (measured,) = _seed(SEED_FP8_MEASUREMENT, tmp_path, HABANA_LOGS=str(logs))
    assert any("measure" in name for name in measured["files"]), measured
    (quantized,) = _seed(SEED_FP8_QUANTIZATION, tmp_path, HABANA_LOGS=str(logs))
    assert quantized["batches"] == 4 and quantized["finite"] is True


def test_seed_device_stats_monitor_example(tmp_path):
    (result,) = _seed(SEED_DEVICE_STATS, tmp_path)
    assert result["stats"] == sorted(["Limit", "InUse", "MaxInUse", "NumAllocs", "NumFrees", "ActiveAllocs",
                                      "MaxAllocSize", "TotalSystemAllocs", "TotalSystemFrees", "TotalActiveAllocs"])


def test_seed_profiler_examples(tmp_path):
    (result,) = _seed(SEED_PROFILER, tmp_path)
    traces = result["traces"]
    assert traces["default"] and traces["custom"], traces  # a Chrome-trace JSON per profiled action
    assert traces["distributed"] and all("perf-logs" in name for name in traces["distributed"]), traces
    assert result["custom"] is True


def test_seed_deepspeed_examples_build_their_trainers(tmp_path):
    (result,) = _seed(SEED_DEEPSPEED, tmp_path, HPU_NB_DEVICE_COUNT="8")
    assert result == {
        "ZeRO-1": [True, 8, 1, False], "ZeRO-2": [True, 8, 2, False], "ZeRO-3": [True, 8, 3, False],
        "ZeRO-Offload": [True, 8, 2, True], "BF16": [True, 8, 2, False],
        "Activation Checkpointing": [True, 8, 3, True],
    }


def test_seed_deepspeed_bf16_optimizer_example_trains_on_two_cards(tmp_path):
    results = _seed(SEED_DEEPSPEED_BF16_OPTIMIZER, tmp_path, HPU_NB_DEVICE_COUNT="2")
    assert sorted(r["rank"] for r in results) == [0, 1]
    assert all(r["world"] == 2 and r["steps"] == 4 and r["device"].startswith("hpu") for r in results), results


def test_seed_readme_example(tmp_path):
    (result,) = _seed(SEED_README, tmp_path, HPU_NB_DEVICE_COUNT="8")
    assert result == {"1": ["SingleHPUStrategy", 1], "8": ["HPUParallelStrategy", 8],
                      "auto": ["HPUParallelStrategy", 8]}


# -- a piece of one flavour given to the other package's Trainer / Fabric ------------------------------------------
def test_a_lightning_piece_in_a_pytorch_lightning_trainer_names_the_import_to_use():
    import pytorch_lightning as pl

    import hpu_nb
    from hpu_nb.wiring.flavours import LightningFlavourError

    with pytest.raises(LightningFlavourError, match=re.escape(
            "hpu_nb's HPUPrecisionPlugin for `lightning.pytorch` was given to a `pytorch_lightning` Trainer")) as err:
        pl.Trainer(accelerator="hpu", plugins=[hpu_nb.HPUPrecisionPlugin(precision="bf16-mixed")], logger=False)
    assert "`from hpu_nb.pytorch_lightning import HPUPrecisionPlugin`" in str(err.value)
    assert isinstance(err.value, TypeError)
    with pytest.raises(LightningFlavourError, match=re.escape("from hpu_nb.pytorch_lightning import HPUAccelerator")):
        pl.Trainer(accelerator=hpu_nb.HPUAccelerator(), logger=False)


def test_a_pytorch_lightning_piece_in_a_lightning_trainer_or_fabric_names_the_import_to_use():
    import lightning as L

    import hpu_nb.lightning_fabric
    import hpu_nb.pytorch_lightning
    from hpu_nb.wiring.flavours import LightningFlavourError

    class MyStrategy(hpu_nb.pytorch_lightning.HPUDDPStrategy):
        pass

    with pytest.raises(LightningFlavourError, match=re.escape(
            "MyStrategy (derived from hpu_nb's HPUDDPStrategy for `pytorch_lightning`) was given to a"
            " `lightning.pytorch` Trainer")) as err:
        L.Trainer(accelerator="hpu", strategy=MyStrategy(), logger=False)
    assert "derive from `from hpu_nb import HPUDDPStrategy`" in str(err.value)
    with pytest.raises(LightningFlavourError, match=re.escape("use `from hpu_nb.fabric import HPUPrecision`")):
        L.Fabric(accelerator="hpu", plugins=[hpu_nb.lightning_fabric.HPUPrecision("bf16-mixed")])


def test_pieces_of_the_right_flavour_and_lightnings_own_errors_are_untouched():
    import lightning as L
    import pytorch_lightning as pl

    import hpu_nb
    import hpu_nb.pytorch_lightning

    trainer = pl.Trainer(accelerator=hpu_nb.pytorch_lightning.HPUAccelerator(), devices=1, logger=False,
                         plugins=[hpu_nb.pytorch_lightning.HPUPrecisionPlugin(precision="bf16-mixed")])
    assert type(trainer.precision_plugin) is hpu_nb.pytorch_lightning.HPUPrecisionPlugin
    trainer = L.Trainer(accelerator=hpu_nb.HPUAccelerator(), devices=1, logger=False,
                        plugins=[hpu_nb.HPUPrecisionPlugin(precision="bf16-mixed")])
    assert type(trainer.precision_plugin) is hpu_nb.HPUPrecisionPlugin
    with pytest.raises(Exception, match="Found invalid type for plugin"):  # not an hpu_nb piece: Lightning's word
        L.Trainer(accelerator="hpu", plugins=[object()], logger=False)


def test_lightning_habanas_lightning_flavour_in_a_pytorch_lightning_trainer_names_the_import(tmp_path):
    """With `lightning` installed lightning_habana's names are its flavour (as the plugin's were); a user of
    `pl.Trainer` is told the import that fits."""
    done = _run(
        """
        import pytorch_lightning as pl
        from lightning_habana.pytorch.plugins import HPUPrecisionPlugin
        try:
            pl.Trainer(accelerator="hpu", plugins=[HPUPrecisionPlugin(precision="bf16-mixed")], logger=False)
        except TypeError as err:
            print(type(err).__name__, "|", err)
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("LightningFlavourError |")
    assert "`from hpu_nb.pytorch_lightning import HPUPrecisionPlugin`" in done.stdout


# -- the plugin's helpers, flags and package data (hpu_nb/lightning_habana_utils.py), as its tests use them ----------
def test_the_plugins_device_and_release_helpers_answer_as_its_did():
    import warnings

    from lightning.fabric.utilities.exceptions import MisconfigurationException

    from lightning_habana.utils import resources

    # the emulated Gaudi2 of the default release: the plugin's tests skip fp8 on "GAUDI" and check "1." releases
    assert resources.get_device_name_from_hlsmi() == resources.get_device_name_from_backend() == "GAUDI2"
    assert resources.get_hpu_synapse_version() == "1.21.0"
    assert resources._parse_hpu_synapse_versions(
        "Habanalabs hl-smi/hlml version hl-1.11.0-fw-45.1.1.1 (Aug 04 2023 - 02:48:21)") == ("1.11.0", "45.1.1.1")
    assert resources._parse_for_device_name("Zephyr 2.7.2-hl-gaudi2-1.17.2-fw-51.5.1-sec-9") == "GAUDI2"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert resources._parse_hpu_synapse_versions("any string as fake CMD output") == ("", "")
        assert resources._parse_for_device_name("any other input") == "GAUDI"
    assert len(caught) == 2 and "hl-smi" in str(caught[0].message)
    assert (resources._parse_hpus(None), resources._parse_hpus("2"), resources._parse_hpus(3)) == (None, 2, 3)
    with pytest.raises(MisconfigurationException, match="must be int, string or None"):
        resources._parse_hpus([1])
    assert set(resources.get_device_stats("hpu")) >= {"Limit", "InUse", "MaxInUse"}


def test_the_plugins_flags_say_what_hpu_nb_can_do():
    from lightning_utilities.core.imports import RequirementCache

    from lightning_habana.pytorch.plugins import precision
    from lightning_habana.pytorch.strategies.deepspeed import _HPU_DEEPSPEED_AVAILABLE
    from lightning_habana.utils import imports

    assert imports._LIGHTNING_GREATER_EQUAL_2_3_0 is True and imports._LIGHTNING_GREATER_EQUAL_2_0_0 is True
    assert imports._HPU_SYNAPSE_GREATER_EQUAL_1_17_0 is True and imports._HABANA_FRAMEWORK_AVAILABLE is True
    assert imports._TORCH_GREATER_EQUAL_2_0_0 is True and imports._TORCH_LESSER_2_3_0 is False
    assert imports._TORCH_LESSER_EQUAL_1_13_1 is False and isinstance(imports._KINETO_AVAILABLE, bool)
    assert isinstance(imports._TORCHVISION_AVAILABLE, RequirementCache)
    # hpu_nb's DeepSpeed strategy runs on DeepSpeed's releases (installed here); fp8 inference on the emulated engine
    assert isinstance(_HPU_DEEPSPEED_AVAILABLE, RequirementCache) and bool(_HPU_DEEPSPEED_AVAILABLE)
    assert precision._INTEL_NEURAL_COMPRESSOR_AVAILABLE is True
    assert precision.is_fp8_available() == (True, "") and precision.is_fp16_available()[0] is True


def test_supported_reduce_ops_are_hccls_and_the_refusal_lists_them_as_the_plugin_did():
    from torch.distributed import ReduceOp

    from hpu_nb.core.strategy_parts.collectives import reduce_op_name
    from lightning_habana.utils.hpu_distributed import supported_reduce_ops

    assert supported_reduce_ops == {"sum": ReduceOp.SUM, "min": ReduceOp.MIN, "max": ReduceOp.MAX,
                                    "product": ReduceOp.PRODUCT}
    with pytest.raises(TypeError, match=f"^Unsupported ReduceOp band. Supported ops in HCCL are: "
                                        f"{', '.join(supported_reduce_ops)}"):
        reduce_op_name("band")
    assert all(reduce_op_name(name) == name for name in supported_reduce_ops)


def test_precision_input_is_the_plugins_names_and_each_keeps_its_name():
    from typing import get_args

    from lightning_habana.pytorch.plugins import HPUPrecisionPlugin
    from lightning_habana.pytorch.plugins.fsdp_precision import _PRECISION_INPUT as fsdp_names
    from lightning_habana.pytorch.plugins.precision import _PRECISION_INPUT

    assert get_args(_PRECISION_INPUT) == ("32", "32-true", "bf16", "bf16-mixed", "fp8", "16-mixed")
    assert fsdp_names is _PRECISION_INPUT
    assert [HPUPrecisionPlugin(name).precision for name in get_args(_PRECISION_INPUT)] == list(
        get_args(_PRECISION_INPUT))
    with pytest.raises(ValueError, match=re.escape(
            "`Trainer(accelerator='hpu', precision='f16-mixed')` is not supported. "
            f"`precision` must be one of: {get_args(_PRECISION_INPUT)}.")):
        HPUPrecisionPlugin(precision="f16-mixed")


def test_the_quant_config_package_holds_hpu_nbs_default_fp8_configs(tmp_path, monkeypatch):
    import importlib.resources

    from lightning_habana.pytorch.plugins import precision
    from lightning_habana.utils.resources import modify_fp8_json

    monkeypatch.setenv("HPU_NB_CACHE_DIR", str(tmp_path))  # the folder is made in hpu_nb's cache directory
    package = importlib.resources.files("lightning_habana.pytorch.plugins.quant_config.fp8")
    measure = json.loads(package.joinpath("maxabs_measure.json").read_text())
    quant = json.loads(package.joinpath("maxabs_quant.json").read_text())
    assert (measure["mode"], measure["observer"]) == ("MEASURE", "maxabs")
    assert (quant["mode"], quant["observer"], quant["scale_method"]) == ("QUANTIZE", "maxabs", "maxabs_hw")
    assert quant["blocklist"] == {"types": [], "names": ["lm_head"]} and "dump_stats_path" in measure
    assert Path(precision.MAXABS_QUANT).name == "maxabs_quant.json"  # the plugin's default path (computed once)
    with importlib.resources.as_file(package.joinpath("maxabs_measure.json")) as path:
        assert path.parent == tmp_path / "lightning_habana" / "quant_config" / "fp8"
        modify_fp8_json(str(path), {"dump_stats_path": "/elsewhere/inc_output/measure"})
        assert json.loads(path.read_text())["dump_stats_path"] == "/elsewhere/inc_output/measure"
        assert json.loads(path.read_text())["mode"] == "MEASURE"  # the other entries are kept

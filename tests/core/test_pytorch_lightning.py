"""The standalone `pytorch_lightning` package works like `lightning`, and `Trainer(accelerator="hpu")` needs no
`import hpu_nb` (torch's device-backend autoload), as when Lightning had Gaudi built in."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

import hpu_nb.pytorch_lightning as hpu_pl


class PLModel(pl.LightningModule):
    """A pytorch_lightning module (not a lightning.LightningModule: the two packages' classes are distinct)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 8)
        self.devices: set[str] = set()
        self.dtypes: set[torch.dtype] = set()

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self.layer(x)
        self.devices.add(str(out.device))
        self.dtypes.add(out.dtype)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def data() -> DataLoader:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(128, 8, generator=gen)
    return DataLoader(TensorDataset(x, x @ torch.randn(8, 8, generator=gen)), batch_size=16)


def quiet(**kwargs):
    return dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                **kwargs)


def test_pl_trainer_with_accelerator_hpu_trains_on_the_device():
    model = PLModel()
    x, y = next(iter(data()))
    before = torch.nn.functional.mse_loss(model.layer(x), y).item()
    trainer = pl.Trainer(accelerator="hpu", max_epochs=10, **quiet())
    assert isinstance(trainer.accelerator, hpu_pl.HPUAccelerator) and isinstance(trainer.accelerator,
                                                                                pl.accelerators.Accelerator)
    assert isinstance(trainer.strategy, hpu_pl.SingleHPUStrategy)
    assert isinstance(trainer.strategy.checkpoint_io, hpu_pl.HPUCheckpointIO)
    trainer.fit(model, data())
    assert model.devices == {"hpu:0"}
    after = torch.nn.functional.mse_loss(model.layer(x), y).item()
    assert after < before / 5


def test_pl_precision_and_profiler_strings(tmp_path):
    model = PLModel()
    trainer = pl.Trainer(accelerator="hpu", precision="bf16-mixed", profiler="hpu", max_steps=2,
                         default_root_dir=tmp_path, **quiet())
    assert isinstance(trainer.precision_plugin, hpu_pl.HPUPrecisionPlugin)
    assert isinstance(trainer.profiler, hpu_pl.HPUProfiler)
    trainer.fit(model, data())
    assert model.dtypes == {torch.bfloat16}  # autocast on "hpu", Habana's lists: the matmul ran in bf16


def test_pl_names_and_instances():
    from pytorch_lightning.strategies import StrategyRegistry

    for name in ("hpu_single", "hpu_parallel", "hpu_ddp", "hpu_fsdp", "hpu_deepspeed_stage_2"):
        assert StrategyRegistry[name]["strategy"].__module__.startswith("hpu_nb._standalone.core"), name
    trainer = pl.Trainer(accelerator=hpu_pl.HPUAccelerator(), strategy=hpu_pl.HPUDDPStrategy(start_method="spawn"),
                         devices=2, **quiet())
    assert type(trainer.strategy) is hpu_pl.HPUDDPStrategy and trainer.strategy.launcher._start_method == "spawn"
    assert trainer.num_devices == 2


def test_the_two_flavours_are_one_source():
    import inspect

    import hpu_nb

    assert hpu_pl.HPUAccelerator is not hpu_nb.HPUAccelerator
    assert inspect.getsourcefile(hpu_pl.HPUAccelerator) == inspect.getsourcefile(hpu_nb.HPUAccelerator)
    bases = {cls.__module__.split(".")[0] for cls in hpu_pl.HPUParallelStrategy.__mro__}
    assert "pytorch_lightning" in bases and "lightning" not in bases


def _fresh_python(code: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("HPU_NB_", "PT_HPU"))}
    full_env.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=180,
                          env=full_env, check=False)


@pytest.mark.parametrize("package", ["lightning", "pytorch_lightning"])
def test_a_fresh_python_that_never_imports_hpu_nb_builds_an_hpu_trainer(package):
    result = _fresh_python(f"""
        import sys
        import {package} as L
        trainer = L.Trainer(accelerator="hpu", devices=1, logger=False)
        print(type(trainer.strategy).__module__, type(trainer.accelerator).__name__)
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    module, accelerator = result.stdout.split()[-2:]
    assert accelerator == "HPUAccelerator"
    assert module == ("hpu_nb.core.strategies.single" if package == "lightning"
                      else "hpu_nb._standalone.core.strategies.single")


def test_after_import_torch_alone_torch_hpu_is_there_as_on_a_gaudi_and_the_device_waits_for_its_first_use():
    """Habana's autoload (1.18+) imports its hpu module and HCCL with torch: Gaudi code uses torch.hpu and "hccl" with
    nothing else imported. The emulated device's kernels (most of the autoload's cost) wait for the first use."""
    result = _fresh_python("""
        import io, sys, torch
        def kernels():
            return torch._C._dispatch_has_kernel_for_dispatch_key("aten::add.Tensor", "HPU")
        print(torch.accelerator.current_accelerator(), "habana_frameworks.torch.hpu" in sys.modules, kernels())
        print(torch.hpu.is_available(), torch.hpu.device_count() >= 1, kernels())
        saved = io.BytesIO()
        torch.save({"w": torch.arange(3.0)}, saved)
        saved.seek(0)
        w = torch.load(saved, map_location="hpu")["w"]
        print(w.device, w.tolist(), torch.hpu is sys.modules["habana_frameworks.torch.hpu"])
        torch.distributed.init_process_group("hccl", store=torch.distributed.HashStore(), rank=0, world_size=1)
        torch.distributed.all_reduce(w)
        print(torch.distributed.get_backend(), w.tolist())
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-4:] == ["None False False", "True True True", "hpu:0 [0.0, 1.0, 2.0] True",
                                               "hccl [0.0, 1.0, 2.0]"]


@pytest.mark.parametrize("env, present", [({"PT_HPU_LAZY_MODE": "1"}, False), ({"PT_HPU_AUTOLOAD": "0"}, False),
                                          ({"PT_HPU_LAZY_MODE": "1", "PT_HPU_AUTOLOAD": "1"}, True)])
def test_torch_hpu_after_import_torch_follows_habana_s_autoload_rule(env, present):
    """Habana's autoload runs in eager mode only, unless PT_HPU_AUTOLOAD says otherwise: code that uses torch.hpu
    or "hccl" without importing habana_frameworks fails in lazy mode on a Gaudi, so it does here."""
    result = _fresh_python("""
        import torch
        print("hpu" in dir(torch), torch.distributed.is_backend_available("hccl"))
    """, **env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-2:] == [str(present), str(present)]


def test_the_autoload_rule_by_release():
    from hpu_nb.runtime.generations import Release

    assert Release(1, 21).autoloads({}) and not Release(1, 21).autoloads({"PT_HPU_LAZY_MODE": "1"})
    assert not Release(1, 18).autoloads({}) and Release(1, 18).autoloads({"PT_HPU_LAZY_MODE": "0"})  # lazy default
    assert Release(1, 18).autoloads({"PT_HPU_AUTOLOAD": "1"}) and not Release(1, 17).autoloads({"PT_HPU_AUTOLOAD": "1"})
    assert not Release(1, 22).autoloads({"PT_HPU_AUTOLOAD": "0"})


def test_the_autoload_can_be_switched_off():
    result = _fresh_python("""
        import sys, torch
        print("hpu_nb" in sys.modules)
        import lightning as L
        try:
            L.Trainer(accelerator="hpu", devices=1, logger=False)
        except Exception as err:
            print(type(err).__name__)
    """, HPU_NB_AUTOLOAD="0")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-2:] == ["False", "ValueError"]  # Lightning's own "invalid accelerator" error

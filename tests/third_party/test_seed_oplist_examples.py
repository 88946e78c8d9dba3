"""lightning-habana's documented customised op-list examples run as written, warning about the names no ATen op has.

lightning-habana's `ops_fp32_mnist.txt` names `cross_entropy` (torch.nn.functional's name; the ATen op is
`cross_entropy_loss`) and `tan`: on a Gaudi the first line is never matched, and the run goes on. The examples pass
the files as `bf16_file_path` / `fp32_file_path`, or inside `hmp_params`, with `precision=16`.
"""

from __future__ import annotations

import warnings

import lightning as L
import pytest
import torch

from hpu_nb import HPUAccelerator, HPUPrecisionPlugin
from hpu_nb.core import oplists
from tests.helpers.models import quiet_trainer_kwargs


class Classifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        self.dtypes: set[torch.dtype] = set()

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        self.dtypes.add(logits.dtype)
        loss = torch.nn.functional.cross_entropy(logits.float(), y)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def data() -> torch.utils.data.DataLoader:
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 16, generator=gen), torch.randint(0, 4, (64,), generator=gen)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)


@pytest.fixture
def op_files(tmp_path, monkeypatch):
    monkeypatch.setattr(oplists, "_warned_unknown", set())
    bf16 = tmp_path / "ops_bf16_mnist.txt"
    fp32 = tmp_path / "ops_fp32_mnist.txt"
    bf16.write_text("linear\nrelu\nmm\n")
    fp32.write_text("cross_entropy\ntan\n")
    return str(bf16), str(fp32)


def plugin_from_file_paths(bf16: str, fp32: str) -> HPUPrecisionPlugin:
    return HPUPrecisionPlugin(precision=16, opt_level="O1", verbose=False, bf16_file_path=bf16, fp32_file_path=fp32)


def plugin_from_hmp_params(bf16: str, fp32: str) -> HPUPrecisionPlugin:
    hmp_params = dict.fromkeys(["level", "verbose", "bf16_ops", "fp32_ops"])
    hmp_params["level"] = "O1"
    hmp_params["verbose"] = False
    hmp_params["bf16_ops"] = bf16
    hmp_params["fp32_ops"] = fp32
    return HPUPrecisionPlugin(precision=16, hmp_params=hmp_params)


@pytest.mark.parametrize("make_plugin", [plugin_from_file_paths, plugin_from_hmp_params])
def test_the_seed_example_trains_and_warns_about_unknown_names(op_files, make_plugin):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        plugin = make_plugin(*op_files)
        model = Classifier()
        trainer = L.Trainer(accelerator=HPUAccelerator(), devices=1, plugins=[plugin], max_steps=4,
                            **quiet_trainer_kwargs())
        trainer.fit(model, data())
    unknown = sorted(str(w.message).split("unknown op ")[1].split(" ")[0] for w in seen
                     if issubclass(w.category, oplists.UnknownOpWarning))
    assert unknown == ["'cross_entropy'"]  # tan is an ATen op; cross_entropy is torch.nn.functional's
    assert trainer.state.finished and trainer.global_step == 4
    assert plugin.op_lists.lower_ops == {"linear", "relu", "mm"}
    assert model.dtypes == {torch.float16}  # precision=16 is fp16 autocast; linear is in the lower list

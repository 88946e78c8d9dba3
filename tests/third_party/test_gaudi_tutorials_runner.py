"""tools/run_gaudi_tutorials.py's own logic, without a checkout of Habana's Gaudi-tutorials: the stand-in data sets'
labelling is fixed and learnable (a training that works lowers the loss, one that does nothing does not), the losses
a notebook prints are read and judged, and the `hpu` device's use is detected from the emulated card's counter."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
STANDINS = ROOT / "tools" / "gaudi_tutorials_standins"
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(STANDINS))

import run_gaudi_tutorials as runner  # noqa: E402
import tutorial_standins as standins  # noqa: E402


def _images(mode: str, classes: int, count: int, size: int = 28) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    labels = rng.integers(classes, size=count)
    images = [np.asarray(standins.class_image(int(k), classes, size, size, mode, rng)) for k in labels]
    return np.stack(images).astype(np.float32) / 255, labels


@pytest.mark.parametrize(("mode", "classes"), [("L", 10), ("RGB", 10), ("RGB", 102)])
def test_every_stand_in_image_carries_its_label(mode: str, classes: int) -> None:
    images, labels = _images(mode, classes, 300, size=32)
    assert [standins.label_of_image(image * 255, classes) for image in images] == labels.tolist()


def test_the_image_folder_stand_in_is_labelled_by_its_class_folder(tmp_path: Path) -> None:
    from PIL import Image

    standins.write_image_folder(str(tmp_path), classes=10, per_class=3, size=32)
    files = sorted((tmp_path / "train").glob("*/*.JPEG"))
    assert len(files) == 30
    folders = sorted({f.parent.name for f in files})
    for path in files:  # saved as JPEG: lossy, the colour still reads back
        assert standins.label_of_image(Image.open(path), 10) == folders.index(path.parent.name)


def _train_linear(images: np.ndarray, labels: np.ndarray, steps: int = 40) -> list[float]:
    torch.manual_seed(0)
    x = torch.from_numpy(images.reshape(len(images), -1))
    x = (x - x.mean()) / x.std()
    y = torch.from_numpy(labels).long()
    model = torch.nn.Linear(x.shape[1], 10)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for step in range(steps):
        batch = slice((step * 32) % len(x), (step * 32) % len(x) + 32)
        loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_the_labelling_is_learnable_and_the_check_tells_it_from_random_labels() -> None:
    """What the stand-ins were missing: with the labels they had (random), a working training and a broken one both
    stay at chance. With the class pattern the loss falls and `falls` says so; shuffled labels on the same images do
    not pass."""
    images, labels = _images("L", 10, 640)
    learned = _train_linear(images, labels)
    assert runner.falls(learned)
    assert sum(learned[-10:]) / 10 < 0.5 * math.log(10)
    shuffled = np.random.default_rng(1).permutation(labels)
    held_out = _train_linear(images[:320], shuffled[:320], steps=10)  # one pass: nothing to memorise yet
    assert not runner.falls(held_out)


def test_glue_stand_in_labels_are_written_into_the_first_text() -> None:
    rng = np.random.default_rng(0)
    for label in range(3):
        sentence = standins._marked_sentence(rng, standins._MARKERS[label], 1)
        assert standins.label_of_text(sentence, 3) == label
        assert standins.label_of_text(sentence, 2) == label if label < 2 else True
    assert standins.label_of_text(standins._marked_sentence(rng, standins._MARKERS[0], 4), 1) == 4.0
    assert not any(m in standins.random_sentence(rng, 30, 40).lower().split() for m in standins._MARKERS)


def _notebook(*cells: tuple[str, str]) -> dict:
    return {"cells": [{"cell_type": "code", "source": source,
                       "outputs": [{"output_type": "stream", "name": "stdout", "text": text}]}
                      for source, text in cells]}


def test_printed_losses_are_read_from_the_chosen_cell_only() -> None:
    nb = _notebook(("loss = cpu_loop()", "[1,    20] loss: 2.500\n"),
                   ("inputs.to(device)", "[1,    20] loss: 2.302\n[1,    40] loss: 1.653\n[2,    20] loss: 0.691\n"),
                   ("print('done')", "Finished Training\n"))
    assert runner.printed_values(nb, r"loss: ([\d.]+)", r"inputs\.to\(device\)") == [2.302, 1.653, 0.691]
    assert runner.printed_values(nb, r"loss: ([\d.]+)") == [2.5, 2.302, 1.653, 0.691]


def test_a_progress_bar_redrawn_with_carriage_returns_counts_each_drawing_once() -> None:
    nb = _notebook(("run()", "Epoch 0: 10% loss=2.30\rEpoch 0: 50% loss=1.20\rEpoch 0: 100% loss=0.40\n"))
    assert runner.printed_values(nb, r"loss=([\d.]+)") == [2.3, 1.2, 0.4]


def test_falls_compares_the_first_values_with_the_last_quarter() -> None:
    assert runner.falls([2.3, 2.2, 1.0, 0.5])
    assert runner.falls([2.3, 3.8, 2.4] + [1.6] * 20 + [1.65] * 8)  # learnt within its first quarter
    assert not runner.falls([2.30, 2.31, 2.29, 2.30, 2.28, 2.30, 2.31, 2.29])  # chance, with noise
    assert not runner.falls([2.3])  # one value: nothing to compare
    assert not runner.falls([])


def _result(allocations: int) -> runner.Result:
    result = runner.Result("x.ipynb")
    result.hpu_allocations = allocations
    return result


def test_judge_counts_a_notebook_as_running_only_where_its_loss_falls_on_hpu() -> None:
    learning = _notebook(("train()", "loss: 2.30\nloss: 1.10\nloss: 0.40\n"))
    flat = _notebook(("train()", "loss: 2.30\nloss: 2.31\nloss: 2.30\n"))
    check = runner.Training(r"loss: ([\d.]+)")
    result = _result(12)
    runner.judge(result, check, learning, {})
    assert (result.status, result.first_loss, result.last_loss) == ("runs on hpu", 2.3, 0.4)
    result = _result(12)
    runner.judge(result, check, flat, {})
    assert result.status == "fails the check on hpu"
    result = _result(0)  # the same falling loss, computed on the CPU
    runner.judge(result, check, learning, {})
    assert result.status == "runs, never touches hpu" and result.last_loss == 0.4


def test_judge_reads_each_lightning_fit_and_its_device() -> None:
    check = runner.Training()
    on_hpu = {"1-0": [(2.3, "hpu"), (1.0, "hpu"), (0.3, "hpu")], "1-1": [(2.2, "hpu"), (0.9, "hpu")]}
    result = _result(40)
    runner.judge(result, check, _notebook(), on_hpu)
    assert (result.status, result.first_loss, result.last_loss) == ("runs on hpu", 2.3, 0.9)
    one_flat = {**on_hpu, "1-1": [(2.2, "hpu"), (2.3, "hpu")]}
    result = _result(40)
    runner.judge(result, check, _notebook(), one_flat)
    assert result.status == "fails the check on hpu"
    on_cpu = {"1-0": [(2.3, "cpu"), (0.3, "cpu")]}
    result = _result(3)  # something else was allocated on hpu, the fit ran on the CPU
    runner.judge(result, check, _notebook(), on_cpu)
    assert result.status == "fails the check on hpu" and "per step on cpu" in result.verdict
    result = _result(40)
    runner.judge(result, check, _notebook(), {})  # no fit recorded
    assert result.status == "fails the check on hpu"


def test_judge_scores_inference_by_its_printed_accuracy() -> None:
    check = runner.Inference(r"Accuracy: ([\d.]+)%")
    result = _result(5)
    runner.judge(result, check, _notebook(("score()", "Accuracy: 99.84%\n")), {})
    assert (result.status, result.accuracy) == ("runs on hpu", 99.84)
    result = _result(5)
    runner.judge(result, check, _notebook(("score()", "Accuracy: 10.12%\n")), {})
    assert result.status == "fails the check on hpu"


def test_edits_apply_to_the_first_matching_cell_and_say_when_they_do_not() -> None:
    nb = {"cells": [{"cell_type": "code", "source": "for i in loader:\n    x = inputs.to(device)\n"
                     "    if i % 200 == 199:\n        print(running_loss / 200)\n"}]}
    tutorial = runner.Tutorial("x.ipynb", (
        runner.Edit(r"inputs\.to\(device\)", r"i % 200 == 199(.|\n)*running_loss / 200",
                    lambda m: m.group(0).replace("200 == 199", "20 == 19").replace("/ 200", "/ 20"), "print more"),
        runner.Edit(r"inputs\.to\(device\)", r"lr=0\.001", "lr=0.01", "learning rate")))
    changes = runner._prepare_cells(nb, tutorial, Path("/home"))
    assert "i % 20 == 19" in nb["cells"][0]["source"] and "running_loss / 20)" in nb["cells"][0]["source"]
    assert changes == ["print more", "(edit not applied, text not found: learning rate)"]


def test_no_tutorial_keeps_the_stale_dl_worker_type_edit_and_every_cut_is_listed() -> None:
    for tutorial in runner.TUTORIALS:
        assert not any("dl-worker-type" in str(edit.new) for edit in tutorial.edits)
    cifar = next(t for t in runner.TUTORIALS if "cifar10" in t.path)
    assert any("CIFAR10" in cut for cut in cifar.cuts)


def test_tensorboard_magics_are_not_skipped() -> None:
    nb = {"cells": [{"cell_type": "code", "source": "%load_ext tensorboard\n%tensorboard --logdir lightning_logs/"}]}
    changes = runner._prepare_cells(nb, runner.Tutorial("x.ipynb"), Path("/home"))
    assert changes == [] and nb["cells"][0]["source"].startswith("%load_ext tensorboard")


def _probe_run(code: str, probes: Path) -> None:
    env = {**os.environ, "GAUDI_TUTORIALS_STANDINS": "1", "GAUDI_TUTORIALS_PROBE_DIR": str(probes),
           "PYTHONPATH": os.pathsep.join([str(STANDINS), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=600, cwd=probes)


def test_the_probe_tells_a_process_that_used_hpu_from_one_that_did_not(tmp_path: Path) -> None:
    cpu, hpu = tmp_path / "cpu", tmp_path / "hpu"
    cpu.mkdir()
    hpu.mkdir()
    _probe_run("import torch, habana_frameworks.torch.core\nprint(torch.ones(3).sum())", cpu)
    _probe_run("import torch, habana_frameworks.torch.core\nprint(torch.ones(3, device='hpu').sum().item())", hpu)
    assert runner.read_probes(cpu)[0] == 0
    assert runner.read_probes(hpu)[0] > 0


def test_the_lightning_probe_records_each_steps_loss_and_device(tmp_path: Path) -> None:
    _probe_run(
        "import torch, lightning.pytorch as pl\n"
        "class M(pl.LightningModule):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.layer = torch.nn.Linear(4, 1)\n"
        "    def training_step(self, batch, i):\n"
        "        return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])\n"
        "    def configure_optimizers(self):\n"
        "        return torch.optim.SGD(self.parameters(), lr=0.1)\n"
        "x = torch.randn(64, 4); data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))\n"
        "trainer = pl.Trainer(accelerator='hpu', devices=1, max_steps=12, logger=False, enable_checkpointing=False,\n"
        "                     enable_progress_bar=False, enable_model_summary=False)\n"
        "trainer.fit(M(), torch.utils.data.DataLoader(data, batch_size=8))\n", tmp_path)
    allocations, fits = runner.read_probes(tmp_path)
    assert allocations > 0
    [steps] = fits.values()
    assert len(steps) == 12 and {device for _, device in steps} == {"hpu"}
    assert runner.falls([loss for loss, _ in steps])
    assert json.loads((next(tmp_path.glob("device-*.jsonl"))).read_text())["hpu_allocations"] == allocations

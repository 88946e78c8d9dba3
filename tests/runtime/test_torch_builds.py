"""The emulated Gaudi on the torch its users have: CPU and CUDA builds, with and without a GPU, old and new releases.

`make test` runs this file on the pinned CPU build; `make test-torch-builds` (called by .ci/run) runs it, with the fast
suite, in environments holding a CUDA build of torch and the newest torch on PyPI (.ci/torch_builds.py). What it
checks is what a new user meets first: torch.accelerator answers, training on `hpu` (one card, bf16, torch.compile,
two cards over HCCL, a notebook cell), and Lightning's plain `Trainer()` unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.accelerators import CPUAccelerator, CUDAAccelerator

import hpu_nb  # noqa: F401  (registers "hpu" with Lightning)
from hpu_nb.emulator.hpu_device import accelerator, build
from hpu_nb.runtime import get_backend
from tests.core.test_parallel import rank_reports, run_fit

pytestmark = pytest.mark.torch_builds

ROOT = Path(__file__).resolve().parents[2]
CUDA_BUILD = torch.version.cuda is not None
GPU = torch.cuda.is_available()


def _fresh_python(code: str, env: dict[str, str] | None = None) -> str:
    """Run `code` in a fresh interpreter of this environment (the accelerator question is settled once a process)."""
    full_env = {key: value for key, value in os.environ.items() if not key.startswith(("HPU_NB_BACKEND", "PT_HPU"))}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
        env={**full_env, **(env or {})}, cwd=str(ROOT), check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


@pytest.mark.timeout(150)
def test_torch_accelerator_answers_before_and_after_hpu_is_used() -> None:
    # built beforehand, as `make setup` does: `import torch` then loads it (a process that asks torch.accelerator before
    # the device's first build gets hpu_nb's DeviceLoadedTooLateError instead, by design)
    build.build(quiet=True)
    report = json.loads(_fresh_python("""
        import json, torch
        def accelerator():
            device = torch.accelerator.current_accelerator()
            return None if device is None else device.type
        before = accelerator()
        x = torch.ones(3, device="hpu", requires_grad=True)
        (x * x).sum().backward()
        print(json.dumps({"before": before, "after": accelerator(), "grad": x.grad.tolist(),
                          "cuda_available": torch.cuda.is_available(), "cuda_count": torch.cuda.device_count()}))
    """))
    # Before hpu is used, torch answers as it always does: the build's own accelerator (a CUDA build says cuda, with
    # or without a GPU), none on a CPU build.
    assert report["before"] == ("cuda" if CUDA_BUILD else None)
    # Once it is used: hpu, as on a Gaudi, unless a usable GPU keeps the question.
    assert report["after"] == ("cuda" if GPU else "hpu")
    assert report["grad"] == [2.0, 2.0, 2.0]
    assert (report["cuda_available"], report["cuda_count"]) == (GPU, torch.cuda.device_count())


def test_the_claim_in_this_process_is_what_torch_says() -> None:
    torch.ones(1, device="hpu")
    claim = accelerator.current_claim()
    assert claim is not None and claim.accelerator == torch.accelerator.current_accelerator().type
    assert claim.describe().startswith("torch.accelerator")


def test_single_card_bf16_fit_trains_on_hpu() -> None:
    model = _Regression()
    before = [p.detach().clone() for p in model.parameters()]
    trainer = L.Trainer(accelerator="hpu", devices=1, precision="bf16-mixed", max_epochs=3, **QUIET)
    trainer.fit(model, _data())
    assert trainer.strategy.root_device.type == "hpu"
    assert model.first_loss is not None and model.last_loss < model.first_loss * 0.7
    assert all(not torch.equal(b, p.detach().cpu()) for b, p in zip(before, model.parameters()))
    assert get_backend().memory_stats()["MaxInUse"] > 0


def test_torch_compile_with_hpu_backend_trains_as_eager_does() -> None:
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1)).to("hpu")
    compiled_module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1)).to("hpu")
    compiled_module.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_module, backend="hpu_backend")
    x, y = torch.randn(32, 8, device="hpu"), torch.randn(32, 1, device="hpu")
    losses = {}
    runs = (("eager", eager, eager), ("compiled", compiled, compiled_module))
    for name, model, parameters_of in runs:
        optimizer = torch.optim.SGD(parameters_of.parameters(), lr=0.1)
        steps = []
        for _ in range(3):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            steps.append(loss.item())
        losses[name] = steps
    assert losses["compiled"] == pytest.approx(losses["eager"], rel=1e-5)
    assert losses["compiled"][-1] < losses["compiled"][0]


def test_a_plain_trainer_still_chooses_the_build_s_own_device() -> None:
    torch.ones(1, device="hpu")  # the emulated card in use in this process changes nothing for Lightning's "auto"
    trainer = L.Trainer(max_epochs=1, **QUIET)
    assert isinstance(trainer.accelerator, CUDAAccelerator if GPU else CPUAccelerator)
    model = _Regression()
    trainer.fit(model, _data())
    assert model.device.type == ("cuda" if GPU else "cpu") and model.last_loss is not None


@pytest.mark.timeout(180)
def test_two_cards_ddp_from_a_script_train_the_same_weights(tmp_path: Path) -> None:
    out = tmp_path / "ddp"
    result = run_fit(out, "--devices", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    reports = rank_reports(out)
    assert [r["rank"] for r in reports] == [0, 1] and {r["process_group_backend"] for r in reports} == {"hccl"}
    assert reports[0]["metrics"]["rank_sum"] == 3.0  # an all-reduce over both ranks
    assert reports[0]["metrics"]["train_loss"] == pytest.approx(reports[1]["metrics"]["train_loss"])
    assert reports[0]["weights_digest"] == reports[1]["weights_digest"]  # DDP kept both replicas equal


@pytest.mark.timeout(180)
def test_a_notebook_cell_trains_on_hpu() -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    cell = textwrap.dedent(f"""
        import sys, json
        sys.path.insert(0, {str(ROOT)!r})
        import lightning as L, torch, hpu_nb
        from tests.runtime.test_torch_builds import _Regression, _data, QUIET
        model = _Regression()
        trainer = L.Trainer(accelerator="hpu", devices=1, precision="bf16-mixed", max_epochs=2, **QUIET)
        trainer.fit(model, _data())
        print(json.dumps({{"device": trainer.strategy.root_device.type, "first": model.first_loss,
                          "last": model.last_loss, "torch": torch.__version__,
                          "accelerator": torch.accelerator.current_accelerator().type}}))
    """)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)])
    nbclient.NotebookClient(nb, timeout=150, kernel_name="python3").execute()
    stdout = "".join(o.get("text", "") for o in nb.cells[0].outputs if o.get("name") == "stdout")
    report = json.loads(stdout.strip().splitlines()[-1])
    assert report["torch"] == torch.__version__  # the kernel runs this environment's torch
    assert report["device"] == "hpu" and report["last"] < report["first"]
    assert report["accelerator"] == ("cuda" if GPU else "hpu")


# -- the pieces, without a second build of torch ------------------------------------------------------------------
def test_the_device_is_compiled_with_the_standard_torch_s_headers_require(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    header = tmp_path / "ATen" / "ATen.h"
    header.parent.mkdir()
    fake_extension = SimpleNamespace(include_paths=lambda: [str(tmp_path)], library_paths=lambda: [])
    monkeypatch.setattr(build, "_cpp_extension", lambda: fake_extension)
    header.write_text("#pragma once\n#include <ATen/Context.h>\n")  # torch <= 2.13: no requirement stated
    assert build.cxx_standard() == "c++17"
    header.write_text(  # torch 2.14 and 2.15
        "#if !defined(_MSC_VER) && __cplusplus < 202002L\n#error C++20 or later compatible compiler is required\n"
    )
    assert build.cxx_standard() == "c++20"
    assert f"-std={build.cxx_standard()}" in build.compile_command("c++", tmp_path / "out.so")


def test_the_installed_torch_s_headers_are_met() -> None:
    standard = build.cxx_standard()
    assert standard == ("c++20" if tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 14) else "c++17")


@pytest.mark.parametrize(("report", "expected"), [
    ("hpu", accelerator.AcceleratorClaim("hpu")),
    ("beside:cuda", accelerator.AcceleratorClaim("cuda", beside="cuda")),
    ("refused:cuda:this platform's C++ ABI is not one hpu_nb knows",
     accelerator.AcceleratorClaim("cuda", beside="cuda", reason="this platform's C++ ABI is not one hpu_nb knows")),
])
def test_the_device_s_report_reads_as_a_claim(report: str, expected: accelerator.AcceleratorClaim) -> None:
    assert accelerator.parse_claim(report) == expected
    with pytest.raises(ValueError, match="unknown accelerator report"):
        accelerator.parse_claim("both")


def test_a_gpu_that_keeps_the_accelerator_is_a_clear_error_with_the_way_out() -> None:
    message = accelerator.conflict_message(
        accelerator.AcceleratorClaim("cuda", beside="cuda"), RuntimeError("internal assert failed\nat engine.cpp")
    )
    assert "serves one accelerator per process, and here it is cuda" in message
    assert "CUDA_VISIBLE_DEVICES= python train.py" in message and "torch said: internal assert failed)" in message
    assert accelerator.AcceleratorClaim("cuda", beside="cuda").describe() == (
        "torch.accelerator stays cuda: this process has a usable cuda device")


# -- a small model ------------------------------------------------------------------------------------------------
QUIET = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False}


def _data() -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(256, 16, generator=generator)
    y = x @ torch.randn(16, 1, generator=generator)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)


class _Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        self.first_loss: float | None = None
        self.last_loss: float | None = None

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x).float(), y)
        if self.first_loss is None:
            self.first_loss = loss.item()
        self.last_loss = loss.item()
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.01)


def test_torch_releases_outside_the_tested_range() -> None:
    with pytest.raises(build.DeviceBuildError, match=r"needs torch 2\.7 or newer .* this is torch 2\.6\.0\+cu124"):
        build.check_torch_release("2.6.0+cu124")
    with pytest.warns(UserWarning, match=r"torch 2\.16\.0 is newer than the releases .* \(2\.7 to 2\.15\)"):
        build.check_torch_release("2.16.0")
    build.check_torch_release(torch.__version__)  # this environment's torch is in the range: nothing said
    assert build.torch_release("2.14.1+cu130") == (2, 14) and build.torch_release("2.6.0a0+git1234") == (2, 6)


def test_beside_a_gpu_the_probe_runs_once_and_its_failure_is_the_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a GPU workstation meets (simulated: this machine has no GPU): the device reports that a usable CUDA keeps
    torch's accelerator; one tiny backward on hpu decides, and where it fails the first use says what to do."""
    probes: list[str] = []

    def probe(settled: accelerator.AcceleratorClaim) -> None:
        probes.append(settled.accelerator)
        assert accelerator.claim().accelerator == "cuda"  # the probe's own device use coming back: no second probe
        raise accelerator.AcceleratorInUseError(accelerator.conflict_message(settled, RuntimeError("assert failed")))

    monkeypatch.setattr(accelerator, "_claim", None)
    monkeypatch.setattr(torch.ops.hpu_emu, "claim_accelerator", lambda: "beside:cuda")
    monkeypatch.setattr(accelerator, "check_backward_beside", probe)
    for _attempt in range(2):  # and every later use says it again, never a backward failing mid-run
        with pytest.raises(accelerator.AcceleratorInUseError, match="CUDA_VISIBLE_DEVICES= python train.py"):
            accelerator.claim()
    assert probes == ["cuda", "cuda"] and accelerator.current_claim() is None

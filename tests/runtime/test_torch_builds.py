"""The emulated Gaudi on the torch its users have: CPU and CUDA builds, with and without a GPU, old and new releases.

`make test` runs this file on the pinned CPU build; `make test-torch-builds` (called by .ci/run) runs it, with the fast
suite, in environments holding a CUDA build of torch and the newest torch on PyPI (.ci/torch_builds.py). What it
checks is what a new user meets first: torch.accelerator answers, training on `hpu` (one card, bf16, torch.compile,
two cards over HCCL, a notebook cell), and Lightning's plain `Trainer()` unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
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


# -- the claim on a CUDA build without a GPU: one object's virtual table, nothing of torch's pages written -----------
NEEDS_A_CLAIM = pytest.mark.skipif(
    not CUDA_BUILD or GPU,
    reason="the claim changes an answer only on a CUDA build without a usable GPU (a CPU build has no other"
    " accelerator; a usable GPU keeps the question)",
)
CUDA_HOOKS_TABLE = "_ZTVN2at4cuda6detail9CUDAHooksE"  # the virtual table of libtorch_cuda's CUDAHooks class

_TRAIN_SEALED = """
    import ctypes, errno, json, os
    import torch
    from tests.helpers import sealed_pages
    library = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cuda.so")
    table, size = sealed_pages.symbol_address(library, {table!r})
    before = ctypes.string_at(table, size)
    writable_before = sealed_pages.make_writable_errno(table)  # what the claim did before: allowed until sealed
    try:
        sealed_pages.seal(library) if {mechanism!r} == "mseal" else sealed_pages.forbid_making_writable(library)
    except sealed_pages.Unavailable as why:
        print(json.dumps({{"skip": str(why)}}))
        raise SystemExit(0)
    writable_after = sealed_pages.make_writable_errno(table)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).to("hpu")  # the first use of hpu: the claim is made now, under the seal
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4, device="hpu"), torch.randn(16, 1, device="hpu")
    weights = model.weight.detach().cpu().clone()
    losses = []
    for _ in range(2):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    print(json.dumps({{
        "accelerator": torch.accelerator.current_accelerator().type, "cuda_available": torch.cuda.is_available(),
        "writable_before": writable_before, "writable_after": errno.errorcode.get(writable_after, writable_after),
        "table_unchanged": ctypes.string_at(table, size) == before, "losses": losses,
        "weights_changed": not torch.equal(weights, model.weight.detach().cpu()),
    }}))
"""


@NEEDS_A_CLAIM
@pytest.mark.timeout(150)
@pytest.mark.parametrize("mechanism", ["mseal", "seccomp"])
def test_the_claim_trains_with_torch_s_read_only_pages_sealed(mechanism: str) -> None:
    """libtorch_cuda's read-only pages sealed as a sealing loader (mseal, Linux >= 6.10) or a seccomp policy leaves
    them: the old claim's mprotect is refused (EPERM: the old claim failed here with AcceleratorInUseError), and the
    claim -- one pointer stored into the hooks object's heap memory -- still makes hpu the accelerator and trains."""
    build.build(quiet=True)
    report = json.loads(_fresh_python(_TRAIN_SEALED.format(table=CUDA_HOOKS_TABLE, mechanism=mechanism)))
    if "skip" in report:
        pytest.skip(f"this machine cannot seal pages with {mechanism}: {report['skip']}")
    assert (report["writable_before"], report["writable_after"]) == (0, "EPERM")  # sealed, and only by the test
    assert report["accelerator"] == "hpu" and report["cuda_available"] is False
    assert report["table_unchanged"]  # the class's virtual table in torch's library: not one byte written
    assert report["weights_changed"] and report["losses"][1] < report["losses"][0]


_REPLACED_ON_DISK = """
    import ctypes, json, os
    import torch
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    libc = ctypes.CDLL(None, use_errno=True)
    # in this process's own mount namespace: another library (another build ID) now answers to libtorch_cuda.so's path
    if libc.mount(os.path.join(lib, "libtorch_cpu.so").encode(), os.path.join(lib, "libtorch_cuda.so").encode(),
                  None, 4096, None) != 0:  # MS_BIND
        print(json.dumps({"skip": "bind mount: " + os.strerror(ctypes.get_errno())}))
        raise SystemExit(0)
    from hpu_nb.emulator.hpu_device import accelerator
    message = None
    try:
        x = torch.ones(2, device="hpu", requires_grad=True)
        (x * x).sum().backward()
    except accelerator.AcceleratorInUseError as err:
        message = str(err)
    print(json.dumps({"message": message, "accelerator": torch.accelerator.current_accelerator().type,
                      "report": torch.ops.hpu_emu.claim_accelerator()}))
"""


@NEEDS_A_CLAIM
@pytest.mark.timeout(150)
def test_where_the_table_s_size_is_unknown_nothing_is_changed_and_the_error_names_the_cpu_build() -> None:
    """The table's size comes from the library's symbol table, read only from the file that was loaded (the same build
    ID): a libtorch_cuda.so replaced on disk since (here: another library bind-mounted over its path, in a mount
    namespace of the test's own) is not read, nothing is changed, and the first use of hpu names the CPU build."""
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-rm", "true"], check=False).returncode != 0:
        pytest.skip("no unprivileged user and mount namespaces here (unshare -rm) to replace the library in")
    build.build(quiet=True)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HPU_NB_BACKEND", "PT_HPU"))}
    result = subprocess.run(
        [unshare, "-rm", sys.executable, "-c", textwrap.dedent(_REPLACED_ON_DISK)], capture_output=True, text=True,
        timeout=120, env=env, cwd=str(ROOT), check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    if "skip" in report:
        pytest.skip(report["skip"])
    assert report["accelerator"] == "cuda"  # torch's own answer, unchanged
    assert report["report"].startswith("refused:cuda:the size of its virtual table is in no symbol table of")
    assert report["message"] is not None and f"`{accelerator.cpu_build_command()}`" in report["message"]
    assert "CUDA_VISIBLE_DEVICES" not in report["message"]


_FIRST_USE_RACE = """
    import json, threading
    import torch
    mode = {mode!r}
    barrier = threading.Barrier(2)
    results = [None, None]
    def first_use(i):
        barrier.wait()
        try:
            if mode == "claim":  # the device library's claim itself, from two threads at once (no Python lock)
                results[i] = torch.ops.hpu_emu.claim_accelerator()
            else:  # what a user's two threads do: use hpu, and train on it
                x = torch.full((2,), float(i + 1), device="hpu", requires_grad=True)
                (x * x).sum().backward()
                results[i] = x.grad.tolist()
        except Exception as err:
            results[i] = repr(err)
    threads = [threading.Thread(target=first_use, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    x = torch.ones(2, device="hpu", requires_grad=True)
    (x * x).sum().backward()
    print(json.dumps({{"results": results, "accelerator": torch.accelerator.current_accelerator().type,
                      "grad": x.grad.tolist(), "claims": torch.ops.hpu_emu.claim_accelerator()}}))
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["claim", "first_use"])
def test_two_threads_first_using_hpu_at_once_settle_one_claim(mode: str) -> None:
    """The claim is settled once per process (std::call_once in the library; the device's lock in Python): two threads
    racing to it get the same report, and both train. Three fresh processes per way in."""
    build.build(quiet=True)
    expected_claim = "beside:cuda" if GPU else "hpu"
    for _round in range(3):
        report = json.loads(_fresh_python(_FIRST_USE_RACE.format(mode=mode)))
        if mode == "claim":
            assert report["results"] == [expected_claim, expected_claim]
        elif not GPU:
            assert report["results"] == [[2.0, 2.0], [4.0, 4.0]]
        assert report["claims"] == expected_claim
        assert report["accelerator"] == ("cuda" if GPU else "hpu")
        if not GPU:
            assert report["grad"] == [2.0, 2.0]


@NEEDS_A_CLAIM
@pytest.mark.timeout(300)
def test_where_virtual_tables_are_signed_the_claim_is_refused_and_says_install_the_cpu_build(tmp_path: Path) -> None:
    """On arm64e (pointer authentication) a copied virtual table would not verify: the library built for such an ABI
    changes nothing and reports why; the first use of hpu then names the CPU build of torch. Simulated here by
    building the device with the ABI's macro set (this machine is x86_64)."""
    compiler = shutil.which(os.environ.get("CXX", "c++"))
    if compiler is None:
        pytest.skip("no C++ compiler to build the device with")
    library = tmp_path / "hpu_device_signed_vtables.so"
    command = build.compile_command(compiler, library) + ["-DHPU_NB_SIGNED_VTABLES=1"]
    compiled = subprocess.run(command, capture_output=True, text=True, timeout=280, check=False)
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    report = json.loads(_fresh_python(f"""
        import json, torch
        torch.ops.load_library({str(library)!r})
        from hpu_nb.emulator.hpu_device import accelerator
        claim = accelerator.parse_claim(torch.ops.hpu_emu.claim_accelerator())
        print(json.dumps({{"accelerator": torch.accelerator.current_accelerator().type, "reason": claim.reason,
                          "message": accelerator.conflict_message(claim)}}))
    """, env={"HPU_NB_AUTOLOAD": "0"}))
    assert report["accelerator"] == "cuda"  # refused, not patched: torch's answer is its own
    assert "signs virtual-table pointers" in report["reason"]
    assert f"`{accelerator.cpu_build_command()}`" in report["message"]
    assert "CUDA_VISIBLE_DEVICES" not in report["message"]


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


def test_an_answer_that_could_not_be_changed_says_install_the_cpu_build_not_hide_the_gpu() -> None:
    """No usable device, so hiding devices changes nothing (measured: CUDA_VISIBLE_DEVICES= failed identically);
    torch's CPU build of the same release has no other accelerator."""
    settled = accelerator.parse_claim("refused:cuda:the size of its virtual table is in neither symbol table of x.so")
    message = accelerator.conflict_message(settled, RuntimeError("element 0 of tensors does not require grad"))
    release = torch.__version__.split("+")[0]
    assert f"`pip install torch=={release} --index-url https://download.pytorch.org/whl/cpu`" in message
    assert "its answer could not be changed to hpu (the size of its virtual table is in neither symbol table" in message
    assert "CUDA_VISIBLE_DEVICES" not in message and "torch said: element 0 of tensors" in message
    assert accelerator.cpu_build_command("2.14.1+cu130") == (
        "pip install torch==2.14.1 --index-url https://download.pytorch.org/whl/cpu")


def test_a_refused_claim_whose_probe_fails_raises_the_cpu_build_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a CUDA build without a GPU meets where the hooks object cannot be given its own table (simulated): the
    first use of hpu raises AcceleratorInUseError naming the CPU build, and stores no claim."""
    monkeypatch.setattr(accelerator, "_claim", None)
    monkeypatch.setattr(torch.ops.hpu_emu, "claim_accelerator", lambda: "refused:cuda:this platform's C++ ABI is not"
                        " one hpu_nb knows")

    def probe(settled: accelerator.AcceleratorClaim) -> None:
        raise accelerator.AcceleratorInUseError(accelerator.conflict_message(settled, RuntimeError("no grad_fn")))

    monkeypatch.setattr(accelerator, "check_backward_beside", probe)
    with pytest.raises(accelerator.AcceleratorInUseError, match=r"Install torch's CPU build .*--index-url"):
        accelerator.claim()
    assert accelerator.current_claim() is None


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

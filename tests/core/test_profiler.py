"""HPUProfiler: real traces from a real fit on the emulated Gaudi, custom actions, summary, the "hpu" string,
HABANA_PROFILE, and the Gaudi path (HPU activity requested) against the fake habana_frameworks."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import warnings
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from hpu_nb import traces
from hpu_nb.core.profiler import EMULATED_NOTE, HPUProfiler
from tests.fake_habana.fixture import fake_gaudi, make_fake_gaudi  # noqa: F401
from tests.helpers.models import LinearModel, quiet_trainer_kwargs, regression_data

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class CustomActionModel(LinearModel):
    """Custom profiling as documented: self.profiler.profile(...) and start/stop around parts of a step."""

    def __init__(self, profiler) -> None:
        super().__init__(features=32)
        self.profiler = profiler

    def training_step(self, batch, batch_idx):
        with self.profiler.profile("my_custom_action"):
            batch = [b * 1.0 for b in batch]
        self.profiler.start("my_granular_action")
        batch = [b + 0.0 for b in batch]
        self.profiler.stop("my_granular_action")
        return super().training_step(batch, batch_idx)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """One short fit with HPUProfiler on accelerator="hpu" (emulated Gaudi), shared by the tests below."""
    from hpu_nb import runtime

    runtime.reset_backend()
    out = tmp_path_factory.mktemp("prof")
    profiler = HPUProfiler(dirpath=str(out), filename="perf-logs", profile_memory=True)
    model = CustomActionModel(profiler)
    trainer = L.Trainer(accelerator="hpu", profiler=profiler, limit_train_batches=6, **quiet_trainer_kwargs())
    trainer.fit(model, regression_data(n=96, features=32, batch_size=16))
    return profiler, out


def test_emulated_profiler_records_cpu_only_and_says_so(fitted):
    profiler, out = fitted
    names = [a.name for a in profiler.activities]
    assert names == ["CPU"]
    paths = profiler.trace_paths()
    assert len(paths) == 1 and os.path.dirname(paths[0]) == str(out)
    assert os.path.basename(paths[0]).startswith("fit-perf-logs")
    trace = traces.load(paths[0])
    assert trace.hpu_nb_info["emulated"] is True and trace.hpu_nb_info["activities"] == ["CPU"]
    assert trace.device_note == EMULATED_NOTE
    assert EMULATED_NOTE in repr(profiler)


def test_trace_from_fit_loads_and_summarises(fitted):
    profiler, _ = fitted
    trace = profiler.load_trace()
    # default schedule: wait 1, warmup 1, active 3 -> three recorded steps, #2..#4
    assert [s.number for s in trace.steps] == [2, 3, 4]
    ops = {r["name"]: r for r in trace.ops(top=500)}
    for name in ("aten::linear", "aten::addmm", "aten::mse_loss"):
        assert name in ops, name
    assert ops["aten::linear"]["calls"] == 3  # one forward per recorded step
    assert ops["aten::linear"]["total"] >= ops["aten::addmm"]["total"] // 2  # linear contains addmm
    assert 0 < ops["aten::linear"]["self"] < ops["aten::linear"]["total"]
    assert trace.memory().peak() > 0  # profile_memory=True recorded [memory] events
    steps = trace.per_step()
    assert steps.column("ops") and min(steps.column("ops")) > 10


def test_custom_actions_are_in_the_trace(fitted):
    profiler, _ = fitted
    ops = {r["name"]: r for r in profiler.load_trace().ops(top=500)}
    assert ops["[pl][profile]my_custom_action"]["calls"] == 3
    assert ops["[pl][profile]my_granular_action"]["calls"] == 3


def test_summary_is_real(fitted):
    profiler, _ = fitted
    text = profiler.summary()
    # which aten ops make the top rows (row_limit=20 by default) varies with timing; that there are some does not
    assert "Top" in text and "aten::" in text and "Steps (3)" in text
    assert EMULATED_NOTE in text


def test_profiler_string_hpu(tmp_path):
    trainer = L.Trainer(accelerator="hpu", profiler="hpu", default_root_dir=str(tmp_path), **quiet_trainer_kwargs())
    assert isinstance(trainer.profiler, HPUProfiler)
    trainer = L.Trainer(accelerator="hpu", profiler="simple", default_root_dir=str(tmp_path), **quiet_trainer_kwargs())
    assert type(trainer.profiler).__name__ == "SimpleProfiler"


@pytest.mark.parametrize("first", ["lightning", "hpu_nb"])
def test_import_order_does_not_matter(first):
    second = "hpu_nb" if first == "lightning" else "lightning"
    code = (
        f"import {first}, {second}\n"
        "import lightning as L\n"
        "t = L.Trainer(accelerator='hpu', profiler='hpu', logger=False, enable_progress_bar=False)\n"
        "print(type(t.profiler).__name__, [a.name for a in t.profiler.activities])\n"
    )
    env = dict(os.environ, HPU_NB_BACKEND="emulated", PYTHONPATH=ROOT)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "HPUProfiler ['CPU']" in out.stdout


def test_habana_profile_is_refused_as_lightning_habana_did(monkeypatch):
    """A configuration error, and an AssertionError as the plugin's assert was (its users' tests catch that), with
    the plugin's words first."""
    monkeypatch.setenv("HABANA_PROFILE", "1")
    for kind in (MisconfigurationException, AssertionError):
        with pytest.raises(kind, match="^`HABANA_PROFILE` should not be set when using `HPUProfiler`: "
                                       "HABANA_PROFILE='1' turns on Habana's own profiler"):
            HPUProfiler()
    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with pytest.raises(AssertionError):
        HPUProfiler()
    gc.collect()
    assert unraisable == []  # the refused profiler is collected without Lightning's teardown failing in __del__
    for ok in ("profile_api_light", ""):
        monkeypatch.setenv("HABANA_PROFILE", ok)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            HPUProfiler()


def test_no_trace_yet_is_a_clear_error(tmp_path):
    profiler = HPUProfiler(dirpath=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="written no trace yet"):
        profiler.last_trace_path()


def test_gaudi_requests_hpu_activity(fake_gaudi):  # noqa: F811
    # Lightning was imported long before the fake habana_frameworks replaced ProfilerActivity:
    # HPUProfiler must still see the new Enum (looked up at creation, not import).
    profiler = HPUProfiler(filename="perf-logs")  # picks the Gaudi backend, which imports habana_frameworks.torch
    activity = torch.profiler.ProfilerActivity
    assert activity.__module__.startswith("habana_frameworks") and hasattr(activity, "HPU")
    assert profiler.activities == [activity.CPU, activity.HPU]
    assert profiler._device_info["backend"] == "gaudi" and profiler._device_info["emulated"] is False
    assert "note" not in profiler._device_info and EMULATED_NOTE not in repr(profiler)
    # explicit activities are the user's choice
    assert HPUProfiler(activities=[activity.HPU]).activities == [activity.HPU]


def test_gaudi_without_hpu_activity_is_a_clear_error(fake_gaudi, monkeypatch):  # noqa: F811
    from hpu_nb.runtime import get_backend

    assert get_backend().name == "gaudi"
    with monkeypatch.context() as patch:  # undone before the fake is uninstalled (which restores torch's own Enum)
        patch.setattr(torch.profiler, "ProfilerActivity", fake_gaudi_original_activity())
        with pytest.raises(RuntimeError, match="ProfilerActivity.HPU"):
            HPUProfiler()


def fake_gaudi_original_activity():
    """A ProfilerActivity without HPU, as torch has before habana_frameworks.torch is imported."""
    import enum

    return enum.Enum("ProfilerActivity", "CPU CUDA")


def test_show_returns_the_viewer_of_the_last_trace(fitted):
    from hpu_nb.notebook.trace_viewer import TraceViewer

    profiler, _ = fitted
    viewer = profiler.show()
    assert isinstance(viewer, TraceViewer)
    assert viewer.trace.path == profiler.last_trace_path()
    assert viewer.note == EMULATED_NOTE
    data, _ = viewer._repr_mimebundle_()
    assert "aten::addmm" in viewer.trace.op_totals()  # the model's matmul was traced
    assert "Top 25 ops by self time" in data["text/plain"] and EMULATED_NOTE in data["text/html"]
    # (which ops make the top 25 by self time depends on timing: the matmul is sometimes just outside)


def test_show_without_the_notebook_layer_says_how_to_get_the_viewer_and_gives_the_text_summary(fitted):
    from hpu_nb.core.profiler import TraceSummaryText
    from hpu_nb.wiring.viewer_slot import register_trace_viewer

    profiler, _ = fitted
    previous = register_trace_viewer(None)  # as in a script that never imported the notebook layer
    try:
        shown = profiler.show()
    finally:
        register_trace_viewer(previous)
    assert isinstance(shown, TraceSummaryText)
    text = repr(shown)
    assert "%load_ext hpu_nb" in text and "Top 25 ops by self time" in text and EMULATED_NOTE in text
    assert os.path.basename(profiler.last_trace_path()) in text


def test_load_ext_registers_the_viewer_show_opens_and_unload_removes_it(fitted):
    pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell

    from hpu_nb.notebook.extension import open_trace_viewer
    from hpu_nb.notebook.trace_viewer import TraceViewer
    from hpu_nb.wiring.viewer_slot import register_trace_viewer, registered_trace_viewer

    profiler, _ = fitted
    previous = register_trace_viewer(None)
    shell = InteractiveShell.instance()
    try:
        shell.run_line_magic("load_ext", "hpu_nb")
        assert registered_trace_viewer() is open_trace_viewer
        viewer = profiler.show()
        assert isinstance(viewer, TraceViewer) and viewer.trace.path == profiler.last_trace_path()
        shell.run_line_magic("unload_ext", "hpu_nb")
        assert registered_trace_viewer() is None
    finally:
        if "hpu_nb" in shell.extension_manager.loaded:
            shell.run_line_magic("unload_ext", "hpu_nb")
        register_trace_viewer(previous)


def test_show_opens_the_viewer_without_load_ext(fitted):
    """In a notebook, `from hpu_nb import HPUProfiler` ... `profiler.show()` draws the viewer with no %load_ext:
    `import hpu_nb` registered an opener that imports the notebook layer's TraceViewer on first use."""
    import hpu_nb
    from hpu_nb.notebook.trace_viewer import TraceViewer
    from hpu_nb.wiring.viewer_slot import register_trace_viewer

    profiler, _ = fitted
    previous = register_trace_viewer(hpu_nb._open_trace_viewer)  # as right after `import hpu_nb`
    try:
        viewer = profiler.show()
    finally:
        register_trace_viewer(previous)
    assert isinstance(viewer, TraceViewer) and viewer.trace.path == profiler.last_trace_path()


def _fresh_python(code: str) -> str:
    """What `code` prints in a new interpreter on the emulated Gaudi (nothing imported before it)."""
    env = dict(os.environ, HPU_NB_BACKEND="emulated", PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_import_hpu_nb_registers_the_viewer_opener_without_loading_the_notebook_layer():
    code = (
        "import sys, hpu_nb, hpu_nb.core.profiler\n"
        "from hpu_nb.wiring.viewer_slot import registered_trace_viewer\n"
        "print(registered_trace_viewer() is hpu_nb._open_trace_viewer,"
        " sorted(m for m in sys.modules if m.startswith('hpu_nb.notebook')))\n"
    )
    assert _fresh_python(code) == "True []"


def test_the_profiler_and_traces_import_no_notebook_layer():
    """core / traces never import hpu_nb.notebook (the viewer is registered from above), even for show()."""
    code = (
        "import sys, hpu_nb.core.profiler, hpu_nb.traces, hpu_nb.wiring.viewer_slot\n"
        "print(sorted(m for m in sys.modules if m.startswith('hpu_nb.notebook')))\n"
    )
    assert _fresh_python(code) == "[]"


def test_profile_memory_drops_only_the_allocator_note_of_a_training_batch(tmp_path, capfd):
    note = ("[W1126 06:45:57.762529259 CPUAllocator.cpp:245] Memory block of unknown size was allocated before the"
            " profiling started, profiler results will not include the deallocation event\n")
    profiler = HPUProfiler(dirpath=str(tmp_path), profile_memory=True)
    profiler._catch_allocator_note()  # what start("run_training_batch") does
    os.write(2, b"user line 1\n" + note.encode() + b"user line 2\n")
    profiler._release_allocator_note()  # stop("run_training_batch")
    profiler._catch_allocator_note()  # the note was seen: later batches run as they are
    assert profiler._batch_block is None
    os.write(2, note.encode())
    assert capfd.readouterr().err == "user line 1\nuser line 2\n" + note
    assert HPUProfiler(dirpath=str(tmp_path))._allocator_note is None  # without profile_memory nothing is caught


def test_one_trace_per_rank_with_filename(tmp_path):
    profilers = {}
    for rank in (1, 10):
        prof = HPUProfiler(dirpath=str(tmp_path), filename="perf-logs")
        prof.setup(stage="fit", local_rank=rank)  # what the Trainer does on each rank of a multi-device run
        profilers[rank] = prof
        name = f"fit-perf-logs-{rank}-[Strategy]X.training_step.{1000 + rank}.pt.trace.json"
        (tmp_path / name).write_text('{"traceEvents": []}')
    for rank, prof in profilers.items():
        assert [os.path.basename(p) for p in prof.trace_paths()] == [
            f"fit-perf-logs-{rank}-[Strategy]X.training_step.{1000 + rank}.pt.trace.json"
        ]


# -- profiler honesty: the emulated device's machinery never shows up as the user's work -----------------------------
class ConvNet(L.LightningModule):
    """Convolution, batch norm, pooling and a linear head: ops of clearly different costs."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Flatten(), torch.nn.Linear(16 * 8 * 8, 10))

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _profiled_fit(accelerator: str, out) -> traces.Trace:
    from torch.utils.data import DataLoader, TensorDataset

    gen = torch.Generator().manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(8 * 16, 3, 16, 16, generator=gen),
                                    torch.randint(0, 10, (8 * 16,), generator=gen)), batch_size=16)
    torch.manual_seed(0)
    profiler = HPUProfiler(dirpath=str(out), filename="p", schedule=torch.profiler.schedule(wait=1, warmup=1, active=4))
    trainer = L.Trainer(accelerator=accelerator, profiler=profiler, **quiet_trainer_kwargs())
    trainer.fit(ConvNet(), data)
    return profiler.load_trace()


def test_a_profile_on_the_emulated_gaudi_shows_the_same_ops_as_on_the_cpu(tmp_path):
    on_cpu = {r["name"]: r for r in _profiled_fit("cpu", tmp_path / "cpu").ops(top=1000)}
    on_hpu = {r["name"]: r for r in _profiled_fit("hpu", tmp_path / "hpu").ops(top=1000)}
    # nothing of the emulation's machinery: no dispatch mode, no fallback, no emulated-device ops
    machinery = [name for name in on_hpu if any(word in name for word in ("DispatchMode", "hpu_emu", "fallback"))]
    assert machinery == []
    # every ATen op ran as often as on the CPU; the device adds only its host -> device copies of the batches
    cpu_calls = {name: r["calls"] for name, r in on_cpu.items() if name.startswith("aten::")}
    hpu_calls = {name: r["calls"] for name, r in on_hpu.items() if name.startswith("aten::")}
    copies = {"aten::to", "aten::_to_copy", "aten::copy_", "aten::_copy_from", "aten::empty_strided"}
    assert {k: v for k, v in hpu_calls.items() if k not in copies} == {k: v for k, v in cpu_calls.items()
                                                                       if k not in copies}
    assert hpu_calls["aten::_copy_from"] >= 2 * 4  # at least the inputs and targets of each recorded step
    assert on_hpu["Optimizer.step#SGD.step"]["calls"] == on_cpu["Optimizer.step#SGD.step"]["calls"] == 4

"""Dynamic shapes and graph-compilation metrics: Habana's switch, metric_global, %hpu_info's data, per-epoch logging.

Rewritten from lightning-habana's test_dynamic_shapes (a model with a dynamic op trains; with the dynamic-shape switch
on there are no more compilations than without). On the emulated Gaudi the compilations are torch.compile's
(`backend="hpu_backend"`), counted for real: here strictly fewer with the switch on.
"""

from __future__ import annotations

import subprocess
import sys

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from hpu_nb import HPUGraphMetrics
from hpu_nb.emulator import graph_compiler
from hpu_nb.notebook.info import format_metric, render_html, render_text
from hpu_nb.runtime import get_backend
from hpu_nb.runtime.info import collect_info


def compile_and_run(batch_sizes: list[int]) -> dict:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)).to("hpu")
    compiled = torch.compile(model, backend="hpu_backend")
    for n in batch_sizes:
        out = compiled(torch.randn(n, 8, device="hpu"))
        assert out.device == torch.device("hpu", 0) and out.shape == (n, 1)
    return graph_compiler.stats()


def test_switches_follow_habana(fresh_compiler, monkeypatch):
    import habana_frameworks.torch.hpu as hthpu

    assert hthpu.get_dynamic_shape_status() is False  # off by default, as in Habana's software
    monkeypatch.setenv("PT_HPU_ENABLE_REFINE_DYNAMIC_SHAPES", "1")
    assert hthpu.get_dynamic_shape_status() is True
    hthpu.disable_dynamic_shape()
    assert hthpu.get_dynamic_shape_status() is False
    hthpu.enable_dynamic_shape()
    assert hthpu.get_dynamic_shape_status() is True and get_backend().dynamic_shapes() is True


def test_without_dynamic_shapes_every_new_shape_recompiles(fresh_compiler):
    stats = compile_and_run([4, 4, 5, 6, 7, 7])
    assert stats["graph_compilation"]["TotalNumber"] == 4 and stats["graph_compilation"]["Recompilations"] == 3
    assert stats["recipe_cache"] == {"TotalHit": 2, "TotalMiss": 4}  # the repeated 4 and 7 reuse their graphs
    assert torch._dynamo.config.automatic_dynamic_shapes is False


def test_with_dynamic_shapes_one_graph_serves_new_shapes(fresh_compiler):
    import habana_frameworks.torch.hpu as hthpu

    hthpu.enable_dynamic_shape()
    stats = compile_and_run([4, 4, 5, 6, 7, 7])
    assert stats["graph_compilation"]["TotalNumber"] == 2  # static first, then one dynamic graph for every size
    assert stats["recipe_cache"]["TotalHit"] == 4


def test_metric_global_as_habana_s(fresh_compiler, monkeypatch):
    import habana_frameworks.torch.hpu as hthpu

    assert hthpu.metrics.metric_global("no_such_metric") is None
    assert hthpu.metrics.metric_global("recipe_cache") is None  # only with PT_HPU_ENABLE_CACHE_METRICS=1
    gc = hthpu.metrics.metric_global("graph_compilation")
    compile_and_run([3, 5])
    stats = dict(gc.stats())
    assert stats["TotalNumber"] == 2 and stats["TotalTime"] > 0 and stats["AvgTime"] == stats["TotalTime"] / 2
    with hthpu.metrics.metric_localcontext("graph_compilation") as local:
        compile_and_run([9])
    assert dict(local.stats())["TotalNumber"] == 1  # a fresh module: compiled once, counted in the block only
    monkeypatch.setenv("PT_HPU_ENABLE_CACHE_METRICS", "1")
    assert dict(hthpu.metrics.metric_global("recipe_cache").stats())["TotalMiss"] == 3


def test_metric_localcontext_stops_counting_when_its_block_ends_and_unknown_names_raise_metric_not_found(
        fresh_compiler):
    """Habana's local metric unsubscribes from its events when the block ends (bridge hpu/metrics/metrics.py:
    metric_localcontext calls stop()): a compilation after the block is not counted (it was: stop() did nothing).
    metric_localcontext raises MetricNotFound for a name the release has not; metric_global gives None for it."""
    import habana_frameworks.torch.hpu as hthpu
    from habana_frameworks.torch.hpu.metrics.exceptions import MetricNotFound

    assert hthpu.metrics.MetricNotFound is MetricNotFound
    gc = hthpu.metrics.metric_global("graph_compilation")
    before = dict(gc.stats())["TotalNumber"]
    with hthpu.metrics.metric_localcontext("graph_compilation") as local:
        compile_and_run([9])
        assert dict(local.stats())["TotalNumber"] == 1
    compile_and_run([11])  # a new module: compiled again, after the block
    assert dict(local.stats())["TotalNumber"] == 1  # Habana's stays 1
    assert dict(gc.stats())["TotalNumber"] == before + 2  # the global metric counts both
    local.start()  # counting again from now on: what happened while stopped stays out
    compile_and_run([13])
    assert dict(local.stats())["TotalNumber"] == 2
    local.reset()
    assert dict(local.stats())["TotalNumber"] == 0
    for name in ("no_such_metric", "recipe_cache"):  # recipe_cache only with PT_HPU_ENABLE_CACHE_METRICS=1
        assert hthpu.metrics.metric_global(name) is None
        with (pytest.raises(MetricNotFound, match=rf"Metric with given name \({name}\) doesn't exist."),
              hthpu.metrics.metric_localcontext(name)):
            pass


class DynamicOpsModel(L.LightningModule):
    """The plugin's DynamicOpsBoringModel: boolean indexing makes the shapes depend on the data."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(32, 2)

    def forward(self, x):
        out = self.layer(x)
        return out[out < 0].view(-1, 1)  # a dynamic op

    def training_step(self, batch, batch_idx):
        return self(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def train_compiled(epochs: int, callbacks: list | None = None) -> L.Trainer:
    L.seed_everything(42, verbose=False)
    x = torch.randn(40 * 7, 32)
    data = DataLoader(TensorDataset(x), batch_size=40)
    model = torch.compile(DynamicOpsModel(), backend="hpu_backend")
    trainer = L.Trainer(accelerator="hpu", devices=1, max_epochs=epochs, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks or [])
    trainer.fit(model, data)
    return trainer


def test_a_dynamic_model_compiles_less_with_the_switch_on(fresh_compiler, monkeypatch):
    train_compiled(epochs=1)
    default = graph_compiler.stats()["graph_compilation"]["TotalNumber"]
    torch._dynamo.reset()
    monkeypatch.setattr(graph_compiler, "COUNTERS", graph_compiler.CompileCounters())
    graph_compiler.set_dynamic_shapes(True)
    train_compiled(epochs=1)
    refined = graph_compiler.stats()["graph_compilation"]["TotalNumber"]
    assert refined < default, (refined, default)


def test_compilations_are_logged_per_epoch(fresh_compiler, monkeypatch):
    import habana_frameworks.torch.hpu as hthpu

    monkeypatch.setenv("PT_HPU_ENABLE_CACHE_METRICS", "1")  # recipe-cache metrics, as on a Gaudi
    hthpu.enable_dynamic_shape()
    monitor = HPUGraphMetrics()
    trainer = train_compiled(epochs=3, callbacks=[monitor])
    assert [h["epoch"] for h in monitor.history] == [0.0, 1.0, 2.0]
    first, *later = monitor.history
    assert first["hpu/graph_compilations"] >= 1
    assert all(h["hpu/graph_compilations"] == 0 for h in later)  # every shape has a graph after the first epoch
    assert all(h["hpu/recipe_cache_hits"] >= 7 for h in later)
    assert trainer.callback_metrics["hpu/graph_compilations"] == 0  # the last epoch's figure, logged


def text_row(text: str, name: str) -> str:
    """The value of %hpu_info's plain-text row `name`."""
    return next(line.strip()[len(name):].strip() for line in text.splitlines() if line.strip().startswith(name))


def test_hpu_info_carries_the_metrics(fresh_compiler):
    compile_and_run([2, 3])
    info = collect_info()
    assert info.metrics["graph_compilation"]["TotalNumber"] == 2
    assert list(info.metrics["graph_compilation"]) == ["TotalNumber", "TotalTime", "AvgTime"]  # Habana's tags only
    assert info.dynamic_shapes is False and "recipe_cache" not in info.metrics
    gc = info.metrics["graph_compilation"]
    shown = f"TotalNumber 2, TotalTime {format_metric('TotalTime', gc['TotalTime'])}, AvgTime " \
            f"{format_metric('AvgTime', gc['AvgTime'])}"  # Habana's times are microseconds: shown with their unit
    assert shown.endswith(("us", "ms", " s"))
    text, page = render_text(info), render_html(info)
    assert text_row(text, "graph_compilation") == shown and text_row(text, "dynamic shapes") == "off"
    assert f"<td><b>graph_compilation</b></td><td>{shown}</td>" in page and "<h4>Metrics</h4>" in page


def test_on_the_fake_gaudi_the_metrics_are_habana_s(make_fake_gaudi):
    fake = make_fake_gaudi()
    fake.set_metric("graph_compilation", TotalNumber=12, TotalTime=3400, AvgTime=3400 / 12)
    info = collect_info()
    assert info.metrics["graph_compilation"] == {"TotalNumber": 12, "TotalTime": 3400, "AvgTime": 3400 / 12}
    import habana_frameworks.torch.hpu as hthpu

    hthpu.enable_dynamic_shape()
    assert collect_info().dynamic_shapes is True and fake.calls.count("enable_dynamic_shape") == 1
    row = text_row(render_text(collect_info()), "graph_compilation")
    assert row == "TotalNumber 12, TotalTime 3.4 ms, AvgTime 283 us"  # Habana's microseconds, with their unit


def test_the_environment_switch_is_read_by_a_new_process():
    code = ("import torch, habana_frameworks.torch.hpu as h; print(h.get_dynamic_shape_status())")
    env_on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                            env={**__import__("os").environ, "PT_HPU_ENABLE_REFINE_DYNAMIC_SHAPES": "1"})
    assert env_on.stdout.split()[-1] == "True"

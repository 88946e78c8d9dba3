"""MemoryMonitor: measured samples, loss and throughput, delta protocol, throttling, logger keys, OOM (one source),
per-rank memory, headless summary, robustness; the callback owns its chart widget."""

from __future__ import annotations

import random
import re
import warnings
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers.logger import Logger

from hpu_nb.notebook.memory_monitor import (
    BATCHES,
    FIELDS,
    LOG_PREFIX,
    LOSS,
    SAMPLES,
    SECONDS,
    ChartHistory,
    MemoryMonitor,
    TrainingChart,
    oom_figures,
    pack_points,
    unpack_points,
)
from tests.helpers.models import LinearModel, quiet_trainer_kwargs, regression_data

FEATURES = 256
PARAM_BYTES = (FEATURES * FEATURES + FEATURES) * 4


class Messages:
    """Records what the monitor sends to the front end, and rebuilds the chart's history as the JS does."""

    def __init__(self, monitor: MemoryMonitor) -> None:
        self.sent: list[dict] = []
        self.points: list[list[int]] = []
        self.seq = 0
        self.gaps = 0
        monitor.chart.comm.send = self._send  # the transport: what really leaves the kernel

    def _send(self, data: dict, metadata: Any = None, buffers: Any = None) -> None:
        msg = dict(data, _buffers=list(buffers or []))
        self.sent.append(msg)
        delta = msg.get("state", {}).get("delta")
        if delta is None:
            return
        points = unpack_points(buffers[0]) if buffers else []  # the points travel as a binary buffer
        if delta["reset"]:
            self.points = points
        else:
            self.gaps += delta["base"] != self.seq
            self.points += points
        self.seq = delta["seq"]

    @property
    def deltas(self) -> list[dict]:
        return [m["state"]["delta"] for m in self.sent if "delta" in m.get("state", {})]


def _same(a: list[list[float]], b: list[list[float]]) -> bool:
    """Equal point lists (NaN, the "no value" of loss and time, equals NaN here)."""
    def norm(points: list[list[float]]) -> list[list[Any]]:
        return [[None if v != v else float(v) for v in p] for p in points]

    return norm(a) == norm(b)


def _fit(monitor: MemoryMonitor, batches: int = 4, epochs: int = 1, features: int = FEATURES,
         **trainer_kwargs: Any) -> L.Trainer:
    trainer = L.Trainer(accelerator="hpu", callbacks=[monitor],
                        **quiet_trainer_kwargs(max_epochs=epochs, **trainer_kwargs))
    trainer.fit(LinearModel(features), regression_data(n=16 * batches, features=features))
    return trainer


def test_history_is_bounded_and_keeps_the_peak() -> None:
    rng = random.Random(0)
    history = ChartHistory(max_points=64)
    spike_at = 7321
    compactions = 0
    for x in range(1, 20001):
        in_use = rng.randint(1000, 2000) if x != spike_at else 999_999
        compactions += history.append([x, 10**6, in_use, max(in_use, 2000), 0, 0, 1.0, 0.01, 16, 1])
        assert len(history) <= 64
    assert compactions == history.compactions > 5
    assert max(p[2] for p in history.points) == 999_999
    assert [p[0] for p in history.points if p[2] == 999_999] == [spike_at]
    xs = [p[0] for p in history.points]
    assert xs == sorted(xs) and xs[-1] > 19000  # still spans the whole run, in order
    # merged samples keep the totals: throughput over the whole run is unchanged by downsampling
    assert sum(p[BATCHES] for p in history.points) == 20000 and sum(p[SAMPLES] for p in history.points) == 320000
    assert sum(p[SECONDS] for p in history.points) == pytest.approx(200.0)
    with pytest.raises(ValueError, match="max_points"):
        ChartHistory(2)


def test_fit_samples_measured_memory_and_sends_deltas() -> None:
    monitor = MemoryMonitor(update_interval=0, auto_display=False)
    messages = Messages(monitor)
    _fit(monitor, batches=4, epochs=2)
    assert monitor.samples == 1 + 8  # the starting point + 8 train batches
    assert monitor.status == "done" and monitor.stage == "fit"
    in_use = [p[2] for p in monitor.history.points]
    assert all(v >= PARAM_BYTES for v in in_use[1:])  # parameters (and more) are on the device while training
    assert monitor.peak >= PARAM_BYTES * 2  # weights + gradients at least
    assert monitor.current["Limit"] == 96 * 2**30 and monitor.headroom == 96 * 2**30 - monitor.peak
    # the front end can rebuild exactly the history from the deltas, and each push is one message
    assert _same(messages.points, monitor.history.points) and messages.gaps == 0
    appends = [m for m in messages.sent if "delta" in m["state"] and not m["state"]["delta"]["reset"]]
    assert appends and all(len(m["_buffers"][0]) <= 2 * len(FIELDS) * 8 for m in appends)  # deltas, not histories
    for msg in messages.sent:
        delta = msg["state"].get("delta")
        if delta and not delta["reset"]:  # counters change every batch (NumAllocs grows): sent with the points
            assert "current" in msg["state"]  # hold_sync: one message for points and counters


def test_updates_are_throttled_by_time() -> None:
    monitor = MemoryMonitor(update_interval=60, auto_display=False)
    messages = Messages(monitor)
    _fit(monitor, batches=6, epochs=2)
    assert monitor.samples == 13
    assert len(messages.deltas) <= 3  # the start, the end (full history) — nothing in between
    assert _same(messages.points, monitor.history.points)


def test_downsampling_resends_the_full_history() -> None:
    monitor = MemoryMonitor(update_interval=0, max_points=8, auto_display=False)
    messages = Messages(monitor)
    _fit(monitor, batches=10, epochs=2)
    assert monitor.samples == 21 and len(monitor.history) <= 8
    assert any(m["state"]["delta"]["reset"] and len(m["_buffers"][0]) > 0
               for m in messages.sent[1:-1] if "delta" in m["state"])
    assert _same(messages.points, monitor.history.points)


def test_frontend_sync_request_gets_everything() -> None:
    monitor = MemoryMonitor(update_interval=60, auto_display=False)
    _fit(monitor, batches=3)
    messages = Messages(monitor)
    monitor._on_frontend_msg(monitor, {"type": "sync"}, [])
    assert messages.deltas[-1]["reset"] and _same(messages.points, monitor.history.points)
    assert len(messages.points) == 4


class RecordingLogger(Logger):
    def __init__(self) -> None:
        super().__init__()
        self.metrics: list[tuple[dict, int]] = []

    @property
    def name(self) -> str:
        return "rec"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        self.metrics.append((metrics, step))

    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        pass


def test_logs_under_device_stats_monitor_keys() -> None:
    logger = RecordingLogger()
    monitor = MemoryMonitor(auto_display=False)
    _fit(monitor, batches=4, logger=logger, log_every_n_steps=2)
    keys = {k for metrics, _ in logger.metrics for k in metrics}
    assert f"{LOG_PREFIX}.on_train_batch_end/InUse" in keys
    assert f"{LOG_PREFIX}.on_train_batch_start/MaxInUse" in keys
    stats_logs = [(m, s) for m, s in logger.metrics if f"{LOG_PREFIX}.on_train_batch_end/InUse" in m]
    assert len(stats_logs) == 2  # every log_every_n_steps, as DeviceStatsMonitor does
    assert all(m[f"{LOG_PREFIX}.on_train_batch_end/InUse"] >= PARAM_BYTES for m, _ in stats_logs)


def test_validate_test_predict_stages() -> None:
    monitor = MemoryMonitor(auto_display=False)
    trainer = L.Trainer(accelerator="hpu", callbacks=[monitor], **quiet_trainer_kwargs())
    model, data = LinearModel(FEATURES), regression_data(n=48, features=FEATURES)
    trainer.validate(model, data)
    assert monitor.stage == "validate" and monitor.samples == 4
    assert {p[4] for p in monitor.history.points[1:]} == {1}
    trainer.predict(model, data)
    assert monitor.stage == "predict" and monitor.samples == 4 and monitor.history.points[-1][4] == 4


def test_oom_run_shows_that_the_limit_was_hit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPU_NB_MEMORY_LIMIT", "6MiB")
    monitor = MemoryMonitor(auto_display=False)
    with pytest.raises(torch.OutOfMemoryError):
        _fit(monitor, batches=4, features=1024)  # 4 MiB of weights, 4 MiB of gradients: more than 6 MiB
    assert monitor.status == "oom"
    oom = monitor.oom
    assert oom["limit"] == 6 * 2**20 and oom["requested"] == 1024 * 1024 * 4
    assert oom["in_use"] + oom["requested"] > oom["limit"]
    text = repr(monitor)
    assert "OUT OF MEMORY" in text and "Limit 6.00 MiB was hit" in text and "no headroom" in text
    html = monitor._repr_html_()
    assert ">OOM</text>" in html and "<svg" in html
    # one source: the error's own figures, in the record the chart, the summary and the counter table all use
    message = monitor.oom["message"]
    assert f"size::{oom['requested']} " in message and f"InUse {oom['in_use']} of Limit {oom['limit']} bytes" in message
    assert monitor.chart.oom == oom
    from hpu_nb.runtime.env import format_bytes

    assert f"{format_bytes(oom['in_use'])} in use: tried to allocate" in text
    assert "Now: InUse" not in text  # the figure after the failure is not shown as if it were the failure's


def test_widget_errors_never_stop_training() -> None:
    monitor = MemoryMonitor(update_interval=0, auto_display=False)

    def broken(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("front end went away")

    monitor.chart.comm.send = broken  # the transport to the front end fails
    with pytest.warns(RuntimeWarning, match="front end went away"):
        trainer = _fit(monitor, batches=4)
    assert trainer.state.finished and monitor.samples == 5  # sampling went on
    assert "live chart disabled" in repr(monitor) and "front end went away" in monitor.frontend_error
    assert monitor.status == "done" and "Peak (MaxInUse)" in repr(monitor)  # the Python side kept its state


def test_device_stats_failure_never_stops_training() -> None:
    monitor = MemoryMonitor(auto_display=False)
    trainer = L.Trainer(accelerator="hpu", callbacks=[monitor], **quiet_trainer_kwargs())
    trainer.accelerator.get_device_stats = lambda device=None: 1 / 0  # type: ignore[method-assign]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(LinearModel(FEATURES), regression_data(n=32, features=FEATURES))
    assert trainer.state.finished and "ZeroDivisionError" in monitor.frontend_error


def test_headless_cell_output_gets_the_summary() -> None:
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    published: list[tuple[dict, dict]] = []

    def publish(data: dict, metadata: Any = None, transient: Any = None, update: bool = False, **kw: Any) -> None:
        published.append((data, {"transient": transient or {}, "update": update}))

    ip.display_pub.publish = publish  # type: ignore[method-assign]
    try:
        monitor = MemoryMonitor()
        ip.execution_count = 41
        _fit(monitor, batches=3)
        ip.execution_count = 42
        _fit(monitor, batches=3)  # a new cell: shown again there
    finally:
        del ip.display_pub.publish
    shown = [p for p in published if not p[1]["update"]]
    updates = [p for p in published if p[1]["update"]]
    live = [p for p in shown if "application/vnd.jupyter.widget-view+json" in p[0]]
    snapshots = [p for p in shown if "text/html" in p[0]]  # each chart is followed by its static snapshot
    assert len(live) == 2 and len(snapshots) == 2 and len(shown) == 4 and len(updates) >= 2
    first = snapshots[0][0]
    assert "No samples yet" in first["text/plain"] or "running" in first["text/plain"]
    final = updates[-1][0]
    assert updates[-1][1]["transient"]["display_id"] == snapshots[1][1]["transient"]["display_id"]
    assert "Peak (MaxInUse)" in final["text/plain"] and "headroom" in final["text/plain"]
    assert "<svg" in final["text/html"] and "GAUDI2 (emulated)" in final["text/html"]


def test_points_pack_exactly() -> None:
    points = [[1, 96 * 2**30, 123_456_789, 2**40 + 7, 4, 2, 0.25, 0.5, 16, 1], [2, 512, 0, 1, 0, 0, 1.0, 0.0, 0, 0]]
    assert unpack_points(pack_points(points)) == points
    assert len(pack_points(points)) == 2 * len(FIELDS) * 8


def test_oom_figures_from_attributes_or_message() -> None:
    message = ("[emulated GAUDI2] MODULE:PT_DEVMEM Allocation failed for size::4194304 (4)MB; InUse 19869708 of Limit "
               "25165824 bytes. HPU out of memory.")
    assert oom_figures(RuntimeError(message)) == {"in_use": 19869708, "requested": 4194304, "limit": 25165824}
    # a Gaudi's message names the request only
    assert oom_figures(RuntimeError("Allocation failed for size::2147483648 (2048)MB")) == {
        "in_use": None, "requested": 2147483648, "limit": None}
    exact = RuntimeError(message)
    exact.in_use = 19_870_000  # a runtime that attaches the exact figures wins over the text
    assert oom_figures(exact)["in_use"] == 19_870_000
    assert oom_figures(RuntimeError("something else")) == {"in_use": None, "requested": None, "limit": None}


def test_loss_and_throughput_are_recorded() -> None:
    monitor = MemoryMonitor(update_interval=0, auto_display=False)
    messages = Messages(monitor)
    trainer = _fit(monitor, batches=4, epochs=2)
    train = monitor.history.points[1:]
    assert [p[BATCHES] for p in train] == [1] * 8  # the first batch is timed from its own start
    assert all(p[SAMPLES] == 16 for p in train) and all(p[SECONDS] > 0 for p in train if p[BATCHES])
    assert [p[5] for p in train] == [0] * 4 + [1] * 4  # the epoch of each sample: the chart marks the boundary
    losses = [p[LOSS] for p in train]
    assert all(loss > 0 for loss in losses) and float(trainer.callback_metrics["train_loss"]) == losses[-1]
    assert messages.points[-1][LOSS] == losses[-1]  # sent as numbers, in the same buffer
    summary = repr(monitor)
    assert f"loss {losses[0]:.4g} -> {losses[-1]:.4g}" in summary and "samples/s" in summary and "steps/s" in summary
    assert "(emulated: CPU time and host memory)" in summary
    html = monitor._repr_html_()
    assert html.count("<svg") == 2 and "training loss" in html and "stroke-dasharray=\"2,3\"" in html


def test_the_callback_owns_its_widget() -> None:
    from lightning.pytorch.callbacks import Callback

    monitor = MemoryMonitor(auto_display=False)
    assert isinstance(monitor, Callback) and isinstance(monitor.chart, TrainingChart)
    assert not isinstance(monitor, TrainingChart)
    trainer = _fit(monitor, batches=2)
    assert trainer.state.finished and monitor.chart.status == "done" and monitor.status == "done"


def test_the_chart_outliving_the_run_keeps_neither_model_nor_trainer() -> None:
    """ipywidgets keeps every live widget, and the chart reaches its monitor: the monitor must not reach the run."""
    import gc
    import weakref

    monitor = MemoryMonitor(update_interval=0, auto_display=False)
    model = LinearModel(FEATURES)
    trainer = L.Trainer(accelerator="hpu", callbacks=[monitor], **quiet_trainer_kwargs(max_epochs=1))
    trainer.fit(model, regression_data(n=32, features=FEATURES))
    gone_model, gone_trainer = weakref.ref(model), weakref.ref(trainer)
    del model, trainer
    gc.collect()
    assert monitor.chart is not None and monitor.status == "done"  # the chart is still there, as in a notebook
    assert gone_model() is None and gone_trainer() is None


def test_a_finished_monitor_nobody_keeps_is_collected_while_its_chart_lives_on() -> None:
    """The chart reaches its monitor through a weakref.proxy (as tqdm.notebook): no chart-callback cycle keeps it."""
    import gc
    import weakref

    from ipywidgets import Widget

    monitor = MemoryMonitor(update_interval=0, auto_display=False)
    _fit(monitor, batches=2)
    chart = monitor.chart
    assert chart is not None and monitor.status == "done"
    gone = weakref.ref(monitor)
    del monitor
    gc.collect()
    assert gone() is None
    assert chart.model_id in Widget.widgets  # ipywidgets still holds the chart, as in a notebook
    chart._handle_custom_msg({"type": "sync"}, [])  # a view asking for the history afterwards: dropped, no error
    chart.close()


def test_ranks_memory_is_gathered_every_logged_step() -> None:
    import torch

    class TwoRanks:  # what a 2-process strategy's all_gather returns: one row per rank
        root_device = torch.device("cpu")

        def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
            return torch.stack([tensor, tensor * 2])

    class Trainer:
        strategy = TwoRanks()

    monitor = MemoryMonitor(auto_display=False)
    monitor.current = {"Limit": 2**30, "InUse": 10 * 2**20, "MaxInUse": 12 * 2**20}
    monitor.history.append([7, 2**30, 10 * 2**20, 12 * 2**20, 0, 0, 0.5, 0.01, 16, 1])
    monitor.samples, monitor.status = 7, "running"
    monitor._gather_ranks(Trainer())
    assert monitor.rank_history == {"x": [7], "in_use": [[10 * 2**20, 20 * 2**20]],
                                    "max_in_use": [[12 * 2**20, 24 * 2**20]]}
    assert monitor.chart.ranks["in_use"] == [[10 * 2**20, 20 * 2**20]]
    assert "Per rank InUse (last gathered): rank 0 10.00 MiB, rank 1 20.00 MiB" in repr(monitor)


def test_ranks_are_gathered_at_the_first_step_too(monkeypatch) -> None:
    """Issue 39: with log_every_n_steps=50 each rank's line started at step 50; it starts at the first step now."""
    monitor = MemoryMonitor(auto_display=False)
    gathered = []
    monkeypatch.setattr(monitor, "_sample", lambda *args, **kwargs: None)
    monkeypatch.setattr(monitor, "_gather_ranks", lambda trainer: gathered.append(trainer.global_step))

    class Trainer:
        world_size, log_every_n_steps, global_step = 2, 50, 0

    trainer = Trainer()
    for step in range(1, 121):
        trainer.global_step = step
        monitor.on_train_batch_end(trainer, None, None, None, step - 1)
    assert gathered == [1, 50, 100]


def test_a_worker_process_never_writes_to_the_front_end() -> None:
    """Multi-device runs fork workers: their copy of the monitor records but sends nothing on the kernel's sockets."""
    monitor = MemoryMonitor(update_interval=0)
    messages = Messages(monitor)
    monitor._owner_pid = -1  # as seen from a forked worker
    _fit(monitor, batches=3)
    assert monitor.detached and "worker process" in monitor.detached
    assert monitor.samples == 4 and monitor.status == "done"  # the worker's own state is complete
    assert messages.sent == []


class _OneInfiniteLoss(LinearModel):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * float("inf") if batch_idx == 1 else loss


def test_an_infinite_loss_leaves_no_nan_in_the_summary_svg() -> None:
    """One inf loss used to write nan coordinates into the static chart (an SVG no viewer draws)."""
    monitor = MemoryMonitor(auto_display=False)
    trainer = L.Trainer(accelerator="hpu", callbacks=[monitor], **quiet_trainer_kwargs(max_epochs=1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(_OneInfiniteLoss(FEATURES), regression_data(n=64, features=FEATURES))
    page = monitor._repr_html_()
    assert "<polyline" in page and "nan" not in page.lower() and "inf," not in page.lower()


def test_summary_says_per_step_and_wall_clock_apart() -> None:
    """The chart plots each step's samples/s; the summary gives their median as 'per step' and, apart, the
    wall-clock figure of the run (slow steps weigh in there): never one number passed off as the other."""
    import statistics

    from hpu_nb.notebook.memory_monitor import TrainingSummary

    monitor = MemoryMonitor(update_interval=0)
    _fit(monitor, batches=6)
    points = monitor.history.points
    timed = [p for p in points if p[SECONDS] == p[SECONDS] and p[SECONDS] > 0]
    assert timed
    # one very slow step (a first compile, a pause): per step barely moves, wall clock drops
    timed[0][SECONDS] = 100.0
    summary = TrainingSummary(monitor)
    training = summary.training()
    rates = sorted(p[SAMPLES] / p[SECONDS] for p in timed)
    assert training["step_samples_per_s"] == pytest.approx(statistics.median(rates))
    wall = sum(p[SAMPLES] for p in timed) / sum(p[SECONDS] for p in timed)
    assert training["samples_per_s"] == pytest.approx(wall) and training["wall_seconds"] >= 100.0
    assert rates[0] <= training["samples_per_s"] < training["step_samples_per_s"]
    text = summary.text()
    assert f"per step (median, as the chart): {training['step_time'] * 1e3:.1f} ms" in text
    assert f"{training['step_samples_per_s']:,.0f} samples/s; wall clock over" in text
    assert f"{training['samples_per_s']:,.0f} samples/s" in text


def test_snapshot_is_static_html_after_the_live_chart() -> None:
    """The monitor's own display: the live chart's output, then its snapshot (no script), which a run's end updates."""
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    published: list[tuple[dict, bool]] = []
    ip.display_pub.publish = lambda data, metadata=None, transient=None, update=False, **kw: published.append(  # type: ignore[method-assign]
        (data, update))
    try:
        monitor = MemoryMonitor(update_interval=0)
        ip.execution_count = 77
        _fit(monitor, batches=3)
    finally:
        del ip.display_pub.publish
    first, second = published[0][0], published[1][0]
    assert set(first) == {"application/vnd.jupyter.widget-view+json", "text/plain"}
    assert 'class="hpu-snapshot" data-hpu-snapshot="MemoryMonitor"' in second["text/html"]
    final = [d for d, update in published if update][-1]
    assert "(done)" in final["text/html"] and "<svg" in final["text/html"] and "<script" not in final["text/html"]


def test_the_chart_displayed_alone_shows_its_snapshot_too() -> None:
    """`display(monitor.chart)`: the live view, then the monitor's snapshot; once the monitor is gone, its text."""
    import gc

    from IPython.core.interactiveshell import InteractiveShell
    from IPython.display import display

    ip = InteractiveShell.instance()
    published: list[dict] = []
    ip.display_pub.publish = lambda data, metadata=None, transient=None, update=False, **kw: published.append(  # type: ignore[method-assign]
        data)
    try:
        monitor = MemoryMonitor(update_interval=0, auto_display=False)
        _fit(monitor, batches=3)
        chart = monitor.chart
        display(chart)
        live, snapshot = published[-2:]
        assert "application/vnd.jupyter.widget-view+json" in live
        assert 'data-hpu-snapshot="MemoryMonitor"' in snapshot["text/html"] and "<svg" in snapshot["text/html"]
        assert "Peak (MaxInUse)" in snapshot["text/plain"]
        del monitor
        gc.collect()
        display(chart)
        live, snapshot = published[-2:]
        assert "application/vnd.jupyter.widget-view+json" in live
        assert 'data-hpu-snapshot="MemoryMonitor"' in snapshot["text/html"] and "<svg" not in snapshot["text/html"]
        assert "Peak (MaxInUse)" in snapshot["text/plain"]  # the summary the chart kept from the run's end
    finally:
        del ip.display_pub.publish


def test_snapshot_draws_throughput_per_step_with_its_own_extremes() -> None:
    """The snapshot has the live chart's three panels; the throughput ticks are 0, the median and the axis top (the
    highest rate, or where a spike is off scale, the robust top and the fastest rate named)."""
    from hpu_nb.notebook.memory.summary import robust_top
    from hpu_nb.notebook.memory_monitor import STAGE, TrainingSummary

    monitor = MemoryMonitor(update_interval=0)
    _fit(monitor, batches=5)
    summary = TrainingSummary(monitor)
    rates = [p[SAMPLES] / p[SECONDS] for p in summary.points if p[STAGE] == 0 and p[BATCHES] > 0 and p[SECONDS] > 0]
    svg = summary.rate_svg()
    assert "throughput per step (samples/s)" in svg and "#9467bd" in svg and "nan" not in svg.lower()
    top = robust_top(sorted(rates))
    assert ">0</text>" in svg and f">{top:,.0f}</text>" in svg
    assert top == max(rates) or f"(fastest {max(rates):,.0f})" in svg
    page = summary.html()
    assert page.count("<svg") == 2 and "samples/s per step" in page  # memory; loss + throughput stacked
    assert svg[svg.index(">") + 1: -len("</svg>")] in summary.training_svg()


# -- several ranks in the snapshot: each rank its own line and legend entry, visible when their memory coincides ------
MIB = 2**20
RANK_LINE = re.compile(r'<polyline data-series="rank(\d+)" fill="none" stroke="([^"]+)" stroke-width="([^"]+)" '
                       r'stroke-opacity="([^"]+)"[^>]*?(?: stroke-dasharray="([^"]+)")? points="([^"]*)"/>')


def _two_rank_monitor(rank1: int) -> MemoryMonitor:
    """Batches 1..5 of rank 0 (InUse 10 MiB, MaxInUse 12 MiB, Limit 1 GiB); both ranks gathered at batches 2..5, rank
    0 at 10 MiB and rank 1 at `rank1` bytes."""
    monitor = MemoryMonitor(auto_display=False)
    for x in range(1, 6):
        monitor.history.append([x, 2**30, 10 * MIB, 12 * MIB, 0, 0, 1.0, 0.01, 8, 1])
    monitor.samples, monitor.status, monitor.stage = 5, "done", "fit"
    monitor.current = {"Limit": 2**30, "InUse": 10 * MIB, "MaxInUse": 12 * MIB}
    monitor.rank_history = {"x": [2, 3, 4, 5], "in_use": [[10 * MIB, rank1]] * 4,
                            "max_in_use": [[12 * MIB, rank1]] * 4}
    return monitor


def _rank_lines(svg: str) -> dict[int, dict[str, str]]:
    return {int(m[1]): {"stroke": m[2], "width": m[3], "opacity": m[4], "dash": m[5] or "", "points": m[6]}
            for m in RANK_LINE.finditer(svg)}


def test_snapshot_draws_each_rank_even_when_their_memory_is_the_same() -> None:
    """Issue 20: two ranks using the same memory looked like one line; issue 39: rank 0 had two lines and two legend
    entries (its sampled InUse and its gathered band). Rank 0's InUse is the sampled line (every batch), each other
    rank a dashed line over it at the gathered batches, so both show where they coincide."""
    from hpu_nb.notebook.memory_monitor import TrainingSummary

    svg = TrainingSummary(_two_rank_monitor(10 * MIB)).memory_svg()
    lines = _rank_lines(svg)
    assert sorted(lines) == [1] and lines[1]["dash"]  # one line per rank: rank 0's is InUse
    # the frame: 640 x 170, plot from x 70 to 630 and y 22 to 148 (its title above it); batches 1..5; the axis tops
    # at the peak (12 MiB, the Limit being off scale) + 8%
    top, height, ymax = 22, 126, 12 * MIB * 1.08
    y = top + height * (1 - 10 * MIB / ymax)
    xs = [70 + 560 * (x - 1) / 4 for x in (2, 3, 4, 5)]
    assert lines[1]["points"] == " ".join(f"{x:.1f},{y:.1f}" for x in xs)
    in_use = re.search(r'stroke="#1f77b4" stroke-width="1.6"\s+points="([^"]*)"', svg)[1]
    assert {p.split(",")[1] for p in in_use.split()} == {f"{y:.1f}"}  # rank 0 at the same height, under rank 1
    assert svg.index('stroke="#1f77b4"') < svg.index('data-series="rank1"')
    assert svg.index(">device memory</text>") < svg.index("<polyline")  # the title, above the plot


def test_snapshot_scales_the_memory_axis_to_the_highest_rank() -> None:
    from hpu_nb.notebook.memory_monitor import TrainingSummary

    svg = TrainingSummary(_two_rank_monitor(30 * MIB)).memory_svg()
    lines = _rank_lines(svg)
    ymax = 30 * MIB * 1.08  # rank 1 is above rank 0's peak: the axis holds it
    ys = {float(p.split(",")[1]) for p in lines[1]["points"].split()}
    assert ys == {round(22 + 126 * (1 - 30 * MIB / ymax), 1)}
    assert min(ys) >= 22  # inside the plot


def test_snapshot_legend_has_one_entry_per_rank_and_series_and_one_device_has_no_rank_entries() -> None:
    from hpu_nb.notebook.memory_monitor import TrainingSummary

    page = TrainingSummary(_two_rank_monitor(10 * MIB)).html()
    assert '<span data-series="rank1"' in page and "rank 1 InUse</span>" in page
    assert "rank 0 InUse</span>" in page and "rank 0 MaxInUse</span>" in page  # the every-batch lines: rank 0's
    assert page.count("InUse</span>") == 3 and "(rank 0)" not in page  # rank 0 InUse, rank 0 MaxInUse, rank 1 InUse
    single = _two_rank_monitor(10 * MIB)
    single.rank_history = {"x": [], "in_use": [], "max_in_use": []}
    page = TrainingSummary(single).html()
    assert 'data-series="rank' not in page and "rank 0" not in page and "━ InUse</span>" in page


def test_snapshot_throughput_axis_ignores_a_spike_and_counts_it() -> None:
    """Issue 39: one 14,360 samples/s step against a median of 258 put every other step on the floor."""
    from hpu_nb.notebook.memory_monitor import TrainingSummary

    monitor = _two_rank_monitor(10 * MIB)
    monitor.history.clear()
    rates = [250.0, 258.0, 262.0, 255.0, 14360.0, 260.0, 257.0, 259.0]
    for x, rate in enumerate(rates, start=1):
        monitor.history.append([x, 2**30, 10 * MIB, 12 * MIB, 0, 0, 1.0, 8 / rate, 8, 1])
    svg = TrainingSummary(monitor).rate_svg()
    assert "1 step off scale (fastest 14,360)" in svg
    ys = [float(p.split(",")[1]) for p in re.search(r'stroke="#9467bd"[^>]*points="([^"]*)"', svg)[1].split()]
    typical = [y for y, rate in zip(ys, rates, strict=True) if rate < 1000]
    # the typical steps sit in the upper half of the plot (y 22..78) instead of within a pixel of its floor
    assert max(typical) < 22 + 56 / 2 and min(ys) >= 22


def test_a_user_interrupt_is_stopped_by_you_not_an_error() -> None:
    from hpu_nb.core.strategy_parts.interrupts import FitInterrupted
    from hpu_nb.notebook.memory_monitor import TrainingSummary

    for interrupt in (KeyboardInterrupt(), FitInterrupted("Stopped by you")):
        monitor = _two_rank_monitor(10 * MIB)
        monitor.status, monitor._finished = "running", False
        monitor.on_exception(None, None, interrupt)
        assert monitor.status == "stopped"
        assert "(stopped by you)" in TrainingSummary(monitor).text() and "error" not in TrainingSummary(monitor).text()
    monitor = _two_rank_monitor(10 * MIB)
    monitor.status, monitor._finished = "running", False
    monitor.on_exception(None, None, RuntimeError("boom"))
    assert monitor.status == "error"


# -- a forked worker's output keeps its order: one pipe to the kernel, flushed at exit ---------------------------------
class _FakePipe:
    def __init__(self) -> None:
        self.sent: list[list[bytes]] = []
        self.linger: int | None = None

    def send_multipart(self, parts: list[bytes], *args: Any, **kwargs: Any) -> None:
        self.sent.append(parts)

    def close(self, linger: int | None = None) -> None:
        self.linger = linger


class _FakeContext:
    terminated = False

    def term(self) -> None:
        self.terminated = True


class _FakeIOPubThread:
    """ipykernel's IOPubThread as a forked child sees it: each message on a new pipe (IOPubThread._really_send)."""

    _pipe_flag = True
    _pipe_uuid = b"k" * 16

    def __init__(self, master: bool = False) -> None:
        self.master = master
        self.pipes: list[tuple[_FakeContext, _FakePipe]] = []

    def _is_master_process(self) -> bool:
        return self.master

    def _setup_pipe_out(self) -> tuple[_FakeContext, _FakePipe]:
        self.pipes.append((_FakeContext(), _FakePipe()))
        return self.pipes[-1]

    def _really_send(self, msg: list[bytes], *args: Any, **kwargs: Any) -> None:
        context, pipe = self._setup_pipe_out()
        pipe.send_multipart([self._pipe_uuid, *msg])
        pipe.close()
        context.term()

    def send_multipart(self, msg: list[bytes]) -> None:  # what session.send calls (the IO thread is not alive here)
        self._really_send(msg)


def test_a_forked_worker_sends_its_output_on_one_pipe_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    import multiprocessing.util
    import sys

    from hpu_nb.core.strategy_parts.worker_output import LINGER_MS, keep_worker_output_in_order

    finalizers: list[Any] = []
    monkeypatch.setattr(multiprocessing.util, "Finalize", lambda obj, fn, exitpriority=None: finalizers.append(fn))
    thread = _FakeIOPubThread()
    monkeypatch.setattr(sys, "stdout", type("OutStream", (), {"pub_thread": thread})())
    assert keep_worker_output_in_order() and keep_worker_output_in_order()  # the second call changes nothing
    for i in range(50):
        thread.send_multipart([b"msg", str(i).encode()])
    assert len(thread.pipes) == 1 and len(finalizers) == 1  # one pipe, one flush at exit
    context, pipe = thread.pipes[0]
    assert pipe.sent == [[thread._pipe_uuid, b"msg", str(i).encode()] for i in range(50)]  # in order, authenticated
    finalizers[0]()  # the worker exits: what the pipe holds is delivered
    assert pipe.linger == LINGER_MS and context.terminated
    thread.send_multipart([b"last flush"])  # after it (multiprocessing flushes stdout last): ipykernel's own way
    assert len(thread.pipes) == 2 and thread.pipes[1][1].sent == [[thread._pipe_uuid, b"last flush"]]


def test_output_order_is_left_alone_in_the_kernel_itself_and_outside_one(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from hpu_nb.core.strategy_parts.worker_output import keep_worker_output_in_order, wait_for_worker_output

    kernel = _FakeIOPubThread(master=True)
    monkeypatch.setattr(sys, "stdout", type("OutStream", (), {"pub_thread": kernel})())
    assert not keep_worker_output_in_order() and "_really_send" not in vars(kernel) and kernel.pipes == []
    monkeypatch.setattr(sys, "stdout", type("Plain", (), {})())
    assert not keep_worker_output_in_order() and not wait_for_worker_output()  # no kernel: nothing to wait for

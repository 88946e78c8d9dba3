"""MemoryMonitor: a Lightning callback that shows, live, the device memory and how training goes.

Why not DeviceStatsMonitor: it needs a logger and shows nothing in the notebook. At the end of every batch (fit /
validate / test / predict) this samples `trainer.accelerator.get_device_stats()` (Limit, InUse, MaxInUse and the
rest) and, for training batches, the loss the step returned, the batch size and the time since the previous batch
(step time and throughput per step; the summary also gives the wall-clock throughput of the whole run). Every
`log_every_n_steps` training steps of a multi-device run the ranks' InUse / MaxInUse are gathered to rank 0 (one small
all_gather), so the chart can show each rank's memory.

The callback *owns* its chart (`monitor.chart`, a `TrainingChart` widget), as tqdm.notebook owns its bar: it is not
itself a widget. The history is bounded (halved when full, always keeping the higher memory point, so the peak
survives); the chart gets only the points added since its last update, at most every `update_interval` seconds, as
one binary buffer in one message. A widget or front-end failure is reported once and never stops training. After the
live chart the monitor displays its snapshot (hpu_nb.notebook.snapshot: text / HTML summary with static SVG charts),
re-published when a run ends: it is what a saved notebook shows without a kernel, and all a headless run has. A
forked or spawned worker (multi-device runs) never writes to the kernel's front end itself: on several cards from a
notebook (forked workers) rank 0 sends its samples and the gathered ranks' memory through a pipe to the kernel's
monitor, which draws them live and keeps the same history and summary as a script's rank 0 (`_WorkerRelay`).

Out of memory: the figures of the chart, the message and the counter table all come from one record (`monitor.oom`),
read from the error itself (its `in_use` / `requested` / `limit` attributes, else its message).

The chart is hand-written SVG in `static/training_chart.js` (shipped in the package: no CDN). bqplot would work
offline too, but it re-sends whole arrays on every update (no deltas, no binary buffers) and would add a dependency
for three small line charts.
"""

from __future__ import annotations

import html
import math
import multiprocessing
import os
import re
import statistics
import threading
import time
import uuid
import warnings
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anywidget
import traitlets
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from hpu_nb.notebook.snapshot import SnapshotDisplays, live_bundle, snapshot_bundle
from hpu_nb.runtime import is_out_of_memory
from hpu_nb.runtime.env import format_bytes

STATIC = Path(__file__).parent / "static"
STAGES = ("train", "validate", "sanity_check", "test", "predict")
LOG_PREFIX = "DeviceStatsMonitor"  # logged keys match Lightning's DeviceStatsMonitor: DeviceStatsMonitor.<hook>/<key>
# one sample: batch number, the three memory counters, stage index, epoch, loss (NaN when none), seconds since the
# previous batch (NaN for the first), samples in the batch, training batches it stands for (merged samples: several)
FIELDS = ("x", "Limit", "InUse", "MaxInUse", "stage", "epoch", "loss", "seconds", "samples", "batches")
X, LIMIT, IN_USE, MAX_IN_USE, STAGE, EPOCH, LOSS, SECONDS, SAMPLES, BATCHES = range(len(FIELDS))
NAN = float("nan")
MAX_RANK_POINTS = 240  # per-rank samples kept (they come every log_every_n_steps)
ALL_GATHER_DEPRECATED = r"torch\.distributed\.nn\.functional\.all_gather is deprecated"


class ChartHistory:
    """Bounded list of samples; halves itself when full, keeping the memory peak and the totals of time / samples."""

    def __init__(self, max_points: int = 600) -> None:
        if max_points < 4:
            raise ValueError(f"max_points must be at least 4, got {max_points}.")
        self.max_points = max_points
        self.points: list[list[float]] = []
        self.compactions = 0

    def __len__(self) -> int:
        return len(self.points)

    def append(self, point: list[float]) -> bool:
        """Add a sample; returns True when the history was downsampled (the front end then needs all of it)."""
        self.points.append(point)
        if len(self.points) <= self.max_points:
            return False
        pts = self.points
        kept = [_merge(a, b) for a, b in zip(pts[0::2], pts[1::2])]
        if len(pts) % 2:
            kept.append(pts[-1])
        self.points = kept
        self.compactions += 1
        return True

    def clear(self) -> None:
        self.points = []

    @property
    def peak(self) -> int:
        return int(max((p[MAX_IN_USE] for p in self.points), default=0))


def _merge(a: list[float], b: list[float]) -> list[float]:
    """Two neighbouring samples as one: the higher memory point, the peak of both, mean loss, summed time / samples."""
    merged = list(a if a[IN_USE] >= b[IN_USE] else b)
    merged[MAX_IN_USE] = max(a[MAX_IN_USE], b[MAX_IN_USE])
    merged[STAGE], merged[EPOCH] = b[STAGE], b[EPOCH]
    losses = [v for v in (_as_float(a[LOSS]), _as_float(b[LOSS])) if not math.isnan(v)]
    merged[LOSS] = sum(losses) / len(losses) if losses else NAN
    timed = [p for p in (a, b) if not math.isnan(p[SECONDS])]
    merged[SECONDS] = sum(p[SECONDS] for p in timed) if timed else NAN
    merged[SAMPLES] = sum(p[SAMPLES] for p in timed)
    merged[BATCHES] = sum(p[BATCHES] for p in timed)
    return merged


def pack_points(points: list[list[float]]) -> memoryview:
    """Points as one binary buffer of float64 (exact for byte counts below 2**53): no per-number JSON work."""
    flat = array("d")
    for point in points:
        flat.extend(point)
    return memoryview(flat.tobytes())


def unpack_points(buffer: Any) -> list[list[float]]:
    """The inverse of pack_points (what the front end does with the buffer)."""
    flat = array("d")
    flat.frombytes(bytes(buffer))
    n = len(FIELDS)
    return [list(flat[i:i + n]) for i in range(0, len(flat), n)]


def oom_figures(error: BaseException) -> dict[str, int | None]:
    """in_use / requested / limit of an out-of-memory error: its attributes, else what its message says."""
    message = str(error)
    figures: dict[str, int | None] = {key: getattr(error, key, None) for key in ("in_use", "requested", "limit")}
    if figures["requested"] is None:
        figures["requested"] = _first_int(message, (r"size::(\d+)", r"allocate (\d+) bytes"))
    if figures["limit"] is None:
        figures["limit"] = _first_int(message, (r"of Limit (\d+) bytes",))
    if figures["in_use"] is None:  # the emulated card says it exactly; a Gaudi's message does not
        figures["in_use"] = _first_int(message, (r"InUse (\d+) of Limit",))
    return figures


def _first_int(message: str, patterns: tuple[str, ...]) -> int | None:
    for pattern in patterns:
        match = re.search(pattern, message)
        if match:
            return int(match.group(1))
    return None


class TrainingChart(anywidget.AnyWidget):
    """The live view a MemoryMonitor owns: memory, loss and throughput over batches (JavaScript in static/)."""

    _esm = STATIC / "training_chart.js"
    _css = STATIC / "training_chart.css"

    uid = traitlets.Unicode().tag(sync=True)
    delta = traitlets.Dict().tag(sync=True)  # {"seq", "base", "reset", "points": pack_points([...FIELDS])}
    current = traitlets.Dict().tag(sync=True)  # the latest counters (all ten)
    ranks = traitlets.Dict().tag(sync=True)  # {"x": [...], "in_use": [[rank0, rank1, ...], ...], "max_in_use": [...]}
    status = traitlets.Unicode("idle").tag(sync=True)  # idle | running | done | oom | error
    stage = traitlets.Unicode("").tag(sync=True)
    device_label = traitlets.Unicode("").tag(sync=True)
    is_emulated = traitlets.Bool(False).tag(sync=True)
    oom = traitlets.Dict().tag(sync=True)  # {"x", "in_use", "limit", "requested", "message", "stage"}
    summary = traitlets.Unicode("").tag(sync=True)
    stages = traitlets.List(list(STAGES)).tag(sync=True)


class MemoryMonitor(Callback):
    """Live device memory, loss and throughput of a Trainer:
    `L.Trainer(accelerator="hpu", callbacks=[MemoryMonitor()])`.

    It shows its chart in the cell that trains (unless it was already shown there); display the monitor yourself to
    put the chart elsewhere. `reset_peak=True` resets the device's MaxInUse when a run starts, so the peak is this
    run's.
    """

    def __init__(self, update_interval: float = 0.25, max_points: int = 600, log_to_logger: bool = True,
                 auto_display: bool = True, reset_peak: bool = True) -> None:
        if update_interval < 0:
            raise ValueError(f"update_interval must be >= 0 seconds, got {update_interval}.")
        self.update_interval = float(update_interval)
        self.history = ChartHistory(max_points)
        self.log_to_logger = log_to_logger
        self.auto_display = auto_display
        self.reset_peak = reset_peak
        self.samples = 0
        self.current: dict[str, Any] = {}
        self.status = "idle"
        self.stage = ""
        self.oom: dict[str, Any] = {}
        self.rank_history: dict[str, list] = {"x": [], "in_use": [], "max_in_use": []}
        self.frontend_error: str | None = None
        self.detached: str | None = None  # why this process must not talk to the front end (a worker process)
        self.device_label, self.is_emulated = _backend_label()
        self._seq = 0
        self._pending: list[list[float]] = []
        self._needs_reset = False
        self._last_push = 0.0
        self._last_batch_end: float | None = None
        self._displays = SnapshotDisplays()
        self._shown_in: int | None = None
        self._finished = True
        self._owner_pid = os.getpid()
        self._relay: Any = None  # the pipe's sending end while forked workers run (their rank 0 writes to it)
        self._relayed: list[list[float]] = []  # rank 0 of forked workers: points not yet sent to the kernel
        self._worker_status: str | None = None  # in the kernel: how the workers' run ended, as rank 0 said
        self.chart: TrainingChart | None = None
        self._guard(self._make_chart)

    # -- Lightning hooks --------------------------------------------------------------------------------------
    @override
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        # In a forked / spawned worker (multi-device runs) the kernel's sockets are not ours to write to.
        if os.getpid() != self._owner_pid or getattr(trainer, "global_rank", 0) != 0:
            self.detached = f"rank {getattr(trainer, 'global_rank', '?')} in worker process {os.getpid()}"
            if getattr(trainer, "global_rank", 0) != 0:
                self._relay = None  # only rank 0 reports to the kernel
        self._start_run(str(getattr(stage, "value", stage)))
        if self.reset_peak and _is_hpu(trainer):
            from hpu_nb.runtime import get_backend

            get_backend().reset_peak_memory_stats()
        self._send_to_kernel("setup", stage=self.stage, device_label=self.device_label, is_emulated=self.is_emulated)
        self._sample(trainer, None)  # the starting point: parameters already on the device
        self._push(force=True)

    def _start_run(self, stage: str) -> None:
        """A run starts: a fresh history, status running, the chart shown in the training cell."""
        self.history.clear()
        self.rank_history = {"x": [], "in_use": [], "max_in_use": []}
        self._pending, self._needs_reset, self.samples, self._relayed = [], True, 0, []
        self._last_batch_end = None
        self._finished = False
        self.device_label, self.is_emulated = _backend_label()
        self.status, self.stage, self.oom = "running", stage, {}
        self._guard(self._set, status=self.status, stage=self.stage, oom={}, summary="", ranks={},
                    device_label=self.device_label, is_emulated=self.is_emulated)
        if self.auto_display and self.detached is None:
            self._guard(self._show_in_current_cell)

    @override
    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._finish("done" if not self.oom else "oom")

    @override
    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self._finished:
            return  # the kernel after forked workers failed: finished with what their rank 0 said
        message = str(exception)
        if is_out_of_memory(exception) or "out of memory" in message.lower():
            stats = self._sample(trainer, None) or dict(self.current)
            figures = oom_figures(exception)
            self.oom = {
                "x": int(self.history.points[-1][X]) if self.history.points else 0,
                "in_use": int(figures["in_use"] if figures["in_use"] is not None else stats.get("InUse", 0)),
                "limit": int(figures["limit"] if figures["limit"] is not None else stats.get("Limit", 0)),
                "requested": figures["requested"],
                "message": message[:500],
                "stage": self._stage_name(trainer),
            }
            self._guard(self._set, oom=self.oom)
            self._finish("oom")
        else:
            self._finish("error")

    @override
    def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
        if self._last_batch_end is None:
            self._last_batch_end = time.perf_counter()
        if self.log_to_logger and trainer.loggers:
            self._log(trainer, "on_train_batch_start", self._stats(trainer))

    @override
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()
        seconds = now - self._last_batch_end if self._last_batch_end is not None else NAN
        self._last_batch_end = now
        self._sample(trainer, "on_train_batch_end", loss=_loss_of(outputs), seconds=seconds, samples=_size_of(batch))
        if getattr(trainer, "world_size", 1) > 1 and trainer.global_step % max(trainer.log_every_n_steps, 1) == 0:
            self._gather_ranks(trainer)

    @override
    def on_validation_batch_start(self, trainer: Any, *args: Any) -> None:
        if self.log_to_logger and trainer.loggers:
            self._log(trainer, "on_validation_batch_start", self._stats(trainer))

    @override
    def on_validation_batch_end(self, trainer: Any, *args: Any) -> None:
        self._sample(trainer, "on_validation_batch_end")
        self._last_batch_end = time.perf_counter()  # the next training step's time starts after validation

    @override
    def on_test_batch_end(self, trainer: Any, *args: Any) -> None:
        self._sample(trainer, "on_test_batch_end")

    @override
    def on_predict_batch_end(self, trainer: Any, *args: Any) -> None:
        self._sample(trainer, "on_predict_batch_end")

    # -- sampling ---------------------------------------------------------------------------------------------
    def _stats(self, trainer: Any) -> dict[str, Any] | None:
        try:
            return trainer.accelerator.get_device_stats(trainer.strategy.root_device)
        except Exception as err:
            self._disable(f"get_device_stats failed: {type(err).__name__}: {err}")
            return None

    def _sample(self, trainer: Any, hook: str | None, loss: Any = None, seconds: float = NAN,
                samples: int = 0) -> dict[str, Any] | None:
        stats = self._stats(trainer)
        if stats is None:
            return None
        if hook is not None and self.log_to_logger and trainer.loggers:
            self._log(trainer, hook, stats)
        if "InUse" in stats:
            self.samples += 1
            in_use = int(stats["InUse"])
            point = [self.samples, int(stats.get("Limit", 0)), in_use, int(stats.get("MaxInUse", in_use)),
                     _stage_index(self._stage_name(trainer)), int(getattr(trainer, "current_epoch", 0)),
                     NAN if loss is None else loss, seconds, samples, 0 if math.isnan(seconds) else 1]
            self._record(point)
            if self._relay is not None:
                self._relayed.append(point)
        self.current = {k: int(v) if isinstance(v, (int, float)) else v for k, v in stats.items()}
        if time.monotonic() - self._last_push >= self.update_interval:
            self._push()
        return stats

    def _record(self, point: list[float]) -> None:
        if self.history.append(point):
            self._needs_reset = True
            self._pending = []
        else:
            self._pending.append(point)

    def _gather_ranks(self, trainer: Any) -> None:
        """Every rank's InUse / MaxInUse to rank 0 (a collective: every rank runs this at the same step)."""
        try:
            import torch

            stats = self.current
            mine = torch.tensor([stats.get("InUse", 0) / 1024.0, stats.get("MaxInUse", 0) / 1024.0],
                                dtype=torch.float32, device=trainer.strategy.root_device)
            with warnings.catch_warnings():  # Lightning's all_gather goes through torch's deprecated functional one
                warnings.filterwarnings("ignore", message=ALL_GATHER_DEPRECATED)
                everyone = trainer.strategy.all_gather(mine).reshape(-1, 2).cpu().tolist()
        except Exception as err:
            self._disable(f"gathering the ranks' memory failed: {type(err).__name__}: {err}")
            return
        history = self.rank_history
        history["x"].append(self.samples)
        history["in_use"].append([int(v[0] * 1024) for v in everyone])
        history["max_in_use"].append([int(v[1] * 1024) for v in everyone])
        for key in history:
            del history[key][:-MAX_RANK_POINTS]
        self._guard(self._set, ranks=dict(history))
        self._send_to_kernel("ranks", ranks=dict(history))

    def _log(self, trainer: Any, hook: str, stats: dict[str, Any] | None) -> None:
        if stats is None:
            return
        connector = getattr(trainer, "_logger_connector", None)
        if connector is not None and not getattr(connector, "should_update_logs", True):
            return
        step = trainer.fit_loop.epoch_loop._batches_that_stepped
        for logger in trainer.loggers:
            sep = getattr(logger, "group_separator", "/")
            logger.log_metrics({f"{LOG_PREFIX}.{hook}{sep}{k}": v for k, v in stats.items()}, step=step)

    @staticmethod
    def _stage_name(trainer: Any) -> str:
        try:
            return str(trainer.state.stage.value) if trainer.state.stage is not None else ""
        except Exception:
            return ""

    # -- front end --------------------------------------------------------------------------------------------
    def _make_chart(self) -> None:
        # uid and the first delta go with the widget's opening message: the front end keys its history by uid
        self.chart = TrainingChart(uid=uuid.uuid4().hex, device_label=self.device_label, is_emulated=self.is_emulated,
                                   delta={"seq": 0, "base": 0, "reset": True, "points": pack_points([])})
        self.chart.on_msg(self._on_frontend_msg)

    def _push(self, force: bool = False) -> None:
        """Send the new points and the current counters in one message."""
        if self._relayed:
            for point in self._relayed:
                point[LOSS] = _as_float(point[LOSS])
            self._send_to_kernel("points", points=self._relayed, current=dict(self.current))
            self._relayed = []
        if not (force or self._pending or self._needs_reset):
            return
        self._last_push = time.monotonic()
        for point in self._pending:  # losses stay tensors until now: one device sync per push, not per batch
            point[LOSS] = _as_float(point[LOSS])
        traits: dict[str, Any] = {"current": dict(self.current)}
        if self._pending or self._needs_reset:
            if self._needs_reset:
                for point in self.history.points:
                    point[LOSS] = _as_float(point[LOSS])
            base = self._seq
            self._seq += 1
            points = self.history.points if self._needs_reset else self._pending
            traits["delta"] = {"seq": self._seq, "base": base, "reset": self._needs_reset,
                               "points": pack_points(points)}
            self._pending, self._needs_reset = [], False
        self._guard(self._set, **traits)

    def _set(self, **traits: Any) -> None:
        if self.chart is None or self.frontend_error is not None or self.detached is not None:
            return  # after a front-end failure, or in a worker, the Python side keeps its state but sends nothing
        with self.chart.hold_sync():
            for name, value in traits.items():
                setattr(self.chart, name, value)

    def _on_frontend_msg(self, widget: Any, content: Any, buffers: Any) -> None:
        """A view that missed deltas (created mid-run, page reloaded) asks for the whole history."""
        if isinstance(content, dict) and content.get("type") == "sync":
            self._needs_reset = True
            self._push(force=True)

    def _finish(self, status: str) -> None:
        if self._finished:
            return
        self._finished = True
        self.status = status
        self._needs_reset = True
        self._push(force=True)
        self._send_to_kernel("finish", status=status, oom=dict(self.oom))
        self._guard(self._set, status=status, summary=TrainingSummary(self).text())
        if self.detached is None:
            self._guard(self._update_displays)
        self._release_the_model()

    def _release_the_model(self) -> None:
        """Forget the `log` / `log_dict` Lightning attached (bound to the LightningModule, which holds its Trainer).

        The chart outlives the run (ipywidgets keeps every live widget, and the widget reaches this monitor through
        its message handler), so without this each training cell would keep its model, Trainer and device memory.
        """
        for name in ("log", "log_dict"):  # Lightning's _CallbackConnector._attach_model_logging_functions
            vars(self).pop(name, None)

    def _guard(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        """Run a front-end operation; on failure say so once and stop sending to the front end."""
        try:
            fn(*args, **kwargs)
        except Exception as err:
            self._disable(f"{type(err).__name__}: {err}")

    def _disable(self, reason: str) -> None:
        if self.frontend_error is None:
            self.frontend_error = reason
            warnings.warn(f"MemoryMonitor stopped updating its chart ({reason}); training goes on.", RuntimeWarning,
                          stacklevel=3)

    # -- forked workers: rank 0 reports to the kernel's monitor --------------------------------------------------
    @contextmanager
    def workers_launched(self, trainer: Any) -> Iterator[None]:
        """Around a launch of forked workers, in the launching process (hpu_nb's launcher calls it): the chart shows
        in the training cell and follows what the workers' rank 0 sends; the run ends with rank 0's status."""
        launcher = getattr(getattr(trainer, "strategy", None), "launcher", None)
        if os.getpid() != self._owner_pid or getattr(launcher, "_start_method", None) != "fork":
            yield  # spawned workers inherit no pipe: they record, as before, and the kernel's monitor stays idle
            return
        receiving, self._relay = multiprocessing.Pipe(duplex=False)
        relay = _WorkerRelay(self, receiving)
        self._worker_status, self.detached = None, None
        self._start_run("")
        self._push(force=True)
        relay.start()
        try:
            yield
        except BaseException:
            self._stop_relay(relay)
            if self._worker_status == "oom":
                self._finish("oom")
            raise
        self._stop_relay(relay)
        self._finish(self._worker_status or "done")

    def _stop_relay(self, relay: _WorkerRelay) -> None:
        sending, self._relay = self._relay, None
        relay.stop(sending)

    def _send_to_kernel(self, kind: str, **message: Any) -> None:
        """In rank 0 of forked workers: one message to the kernel's monitor (never stops training)."""
        if self._relay is None or os.getpid() == self._owner_pid:
            return
        try:
            self._relay.send((kind, message))
        except Exception as err:
            self._relay = None
            warnings.warn(f"MemoryMonitor could not report to the notebook ({type(err).__name__}: {err}); training "
                          "goes on.", RuntimeWarning, stacklevel=3)

    def _received(self, kind: str, message: dict[str, Any]) -> None:
        """In the kernel: apply what rank 0 of the workers sent, as if this monitor had sampled it."""
        if kind == "setup":
            self.stage, self.device_label, self.is_emulated = (message["stage"], message["device_label"],
                                                               message["is_emulated"])
            self._guard(self._set, stage=self.stage, device_label=self.device_label, is_emulated=self.is_emulated)
        elif kind == "points":
            for point in message["points"]:
                self.samples = int(point[X])
                self._record(point)
            self.current = message["current"]
            self._push(force=True)
        elif kind == "ranks":
            self.rank_history = message["ranks"]
            self._guard(self._set, ranks=dict(self.rank_history))
        elif kind == "finish":
            self._worker_status, self.oom = message["status"], message["oom"]
            if self.oom:
                self._guard(self._set, oom=self.oom)

    # -- display ----------------------------------------------------------------------------------------------
    def _live(self) -> dict[str, Any] | None:
        """The live chart's output (None after a front-end failure: then only the snapshot is shown)."""
        if self.chart is None or self.frontend_error is not None:
            return None
        return live_bundle(self.chart, f"MemoryMonitor live chart ({self.device_label}); its summary follows")

    def _snapshot(self) -> dict[str, str]:
        """What stays in the saved notebook: the summary and the static charts (no JavaScript)."""
        summary = TrainingSummary(self)
        return snapshot_bundle("MemoryMonitor", summary.html(), summary.text())

    def _ipython_display_(self) -> None:
        self._displays.show(self._live(), self._snapshot())
        self._shown_in = _execution_count()

    def _show_in_current_cell(self) -> None:
        count = _execution_count()
        if count is None or count == self._shown_in:
            return
        self._ipython_display_()

    def _update_displays(self) -> None:
        """The run's final state into every snapshot (the live chart updates itself)."""
        if self._displays.snapshots:
            self._displays.refresh(self._snapshot())

    def __repr__(self) -> str:
        return TrainingSummary(self).text()

    def _repr_html_(self) -> str:
        return TrainingSummary(self).html()

    @property
    def peak(self) -> int:
        """The highest MaxInUse seen in the last run, in bytes."""
        return TrainingSummary(self).peak

    @property
    def headroom(self) -> int | None:
        """Limit minus the peak, in bytes (None before any sample)."""
        limit = TrainingSummary(self).limit
        return None if limit is None else limit - self.peak


class _WorkerRelay:
    """The kernel's end of the pipe from the workers' rank 0: a thread hands each message to the monitor while the
    cell waits for the workers (the chart's updates are widget messages: any thread of the kernel may send them)."""

    def __init__(self, monitor: MemoryMonitor, receiving: Any) -> None:
        self.monitor, self.receiving = monitor, receiving
        self.thread = threading.Thread(target=self._run, name="MemoryMonitor relay", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self, sending: Any) -> None:
        """After the workers ended: everything they sent is read, then the thread ends on our own last message."""
        try:
            sending.send(("end", {}))
        finally:
            sending.close()
        self.thread.join(timeout=30)
        self.receiving.close()

    def _run(self) -> None:
        while True:
            try:
                kind, message = self.receiving.recv()
            except (EOFError, OSError):
                return
            if kind == "end":
                return
            try:
                self.monitor._received(kind, message)
            except Exception as err:
                self.monitor._disable(f"following the workers failed: {type(err).__name__}: {err}")


class TrainingSummary:
    """Text, HTML and static SVG charts of a monitor's state: what stays in the output without a front end."""

    def __init__(self, monitor: MemoryMonitor) -> None:
        self.points = [[_as_float(v) for v in p] for p in monitor.history.points]
        self.current = dict(monitor.current)
        self.device_label = monitor.device_label
        self.is_emulated = monitor.is_emulated
        self.stage = monitor.stage
        self.status = monitor.status
        self.oom = dict(monitor.oom)
        self.samples = monitor.samples
        self.error = monitor.frontend_error
        self.ranks = monitor.rank_history

    @property
    def limit(self) -> int | None:
        if self.oom.get("limit"):
            return int(self.oom["limit"])
        return self.current.get("Limit") or (int(self.points[-1][LIMIT]) if self.points else None)

    @property
    def peak(self) -> int:
        return int(max([p[MAX_IN_USE] for p in self.points] + [self.current.get("MaxInUse", 0)]))

    def training(self) -> dict[str, float] | None:
        """Loss and throughput of the training batches: first / last loss, median step time, samples/s, steps/s."""
        train = [p for p in self.points if p[STAGE] == 0]
        losses = [p[LOSS] for p in train if not math.isnan(p[LOSS])]
        timed = [p for p in train if p[BATCHES] > 0 and p[SECONDS] > 0]
        if not (losses or timed):
            return None
        out: dict[str, float] = {}
        if losses:
            out.update(first_loss=losses[0], last_loss=losses[-1])
        if timed:
            # per step (what the chart's throughput panel plots): each sample's own samples / seconds, the median;
            # wall clock: all samples over all the time between training batch ends (slow steps weigh in)
            out["step_time"] = statistics.median(p[SECONDS] / p[BATCHES] for p in timed)
            out["step_samples_per_s"] = statistics.median(p[SAMPLES] / p[SECONDS] for p in timed)
            total_s = sum(p[SECONDS] for p in timed)
            out["wall_seconds"] = total_s
            out["samples_per_s"] = sum(p[SAMPLES] for p in timed) / total_s
            out["steps_per_s"] = sum(p[BATCHES] for p in timed) / total_s
        return out

    def lines(self) -> list[str]:
        measured = " (emulated: CPU time and host memory)" if self.is_emulated else ""
        head = f"MemoryMonitor — {self.device_label}"
        if self.status == "idle" and not self.points:
            return [head, "No samples yet: pass it to a Trainer as a callback (callbacks=[monitor]) and fit."]
        lines = [f"{head} — {self.stage or 'run'}: {self.samples} batches sampled ({self.status})"]
        if "InUse" not in self.current:
            lines.append(f"This accelerator reports no HPU memory counters: {sorted(self.current)}")
            return lines
        limit, peak = self.limit or 0, self.peak
        if self.oom:
            needed = self.oom["in_use"] + (self.oom.get("requested") or 0)
            lines.append(
                f"Peak (MaxInUse) {format_bytes(peak)} of Limit {format_bytes(limit)}{measured}: no headroom — the run "
                f"needed at least {format_bytes(needed)}, {format_bytes(max(needed - limit, 0))} more than the Limit"
            )
        else:
            pct = 100.0 * (limit - peak) / limit if limit else 0.0
            lines.append(f"Peak (MaxInUse) {format_bytes(peak)} of Limit {format_bytes(limit)}{measured}: "
                         f"headroom {format_bytes(limit - peak)} ({pct:.1f}% free)")
        shown = {k: v for k, v in self.current.items() if k not in ("Limit", "MaxInUse")}
        if self.oom:
            shown.pop("InUse", None)  # after an OOM the figure that counts is the one at the failure, below
        lines.append("Now: " + ", ".join(
            f"{k} {format_bytes(v) if k in ('InUse', 'MaxAllocSize') else v}" for k, v in shown.items()))
        training = self.training()
        if training:
            parts = []
            if "last_loss" in training:
                parts.append(f"loss {training['first_loss']:.4g} -> {training['last_loss']:.4g}")
            if "step_time" in training:
                parts.append(f"per step (median, as the chart): {training['step_time'] * 1e3:.1f} ms, "
                             f"{training['step_samples_per_s']:,.0f} samples/s; wall clock over "
                             f"{training['wall_seconds']:.1f} s of training batches: {training['steps_per_s']:.1f} "
                             f"steps/s, {training['samples_per_s']:,.0f} samples/s")
            lines.append("Training: " + "; ".join(parts) + measured)
        if self.ranks.get("x"):
            last = self.ranks["in_use"][-1]
            lines.append("Per rank InUse (last gathered): " + ", ".join(
                f"rank {r} {format_bytes(v)}" for r, v in enumerate(last)))
        if self.oom:
            requested = self.oom.get("requested")
            ask = f": tried to allocate {format_bytes(requested)}" if requested else ""
            lines.append(
                f"OUT OF MEMORY at batch {self.oom['x']} ({self.oom.get('stage', '?')}): the Limit "
                f"{format_bytes(limit)} was hit with {format_bytes(self.oom['in_use'])} in use{ask}."
            )
        if self.error:
            lines.append(f"(live chart disabled after a widget error: {self.error}; training was not affected)")
        return lines

    def text(self) -> str:
        return "\n".join(self.lines())

    def memory_svg(self, width: int = 640, height: int = 170) -> str:
        """InUse / MaxInUse (and Limit when in scale) vs batch, epoch marks, the OOM marker."""
        if not self.points:
            return ""
        limit, peak = self.limit or 1, self.peak
        top = max(peak, self.oom.get("in_use", 0) + (self.oom.get("requested") or 0))
        show_limit = bool(self.oom) or top >= 0.05 * limit
        ymax = max(limit if show_limit else top, top, 1) * 1.08
        plot = _Plot(self.points, width, height, ymax, self.oom.get("x", 0))
        parts = plot.frame([(0, format_bytes(0)), (ymax / 1.08 / 2, format_bytes(ymax / 1.08 / 2)),
                            (ymax / 1.08, format_bytes(ymax / 1.08))])
        if show_limit:
            parts.append(plot.line(LIMIT, "#d62728", 'stroke-dasharray="5,3"'))
        else:
            parts.append(f'<text x="{plot.left + 6}" y="{plot.top + 12}" fill="#d62728">Limit {format_bytes(limit)} '
                         "(off scale)</text>")
        parts += [plot.line(MAX_IN_USE, "#ff7f0e"), plot.line(IN_USE, "#1f77b4")]
        if self.oom:
            x, y0 = plot.sx(self.oom["x"]), plot.sy(self.oom["in_use"])
            y1 = max(plot.sy(self.oom["in_use"] + (self.oom.get("requested") or 0)), plot.top)
            parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y0:.1f}" y2="{y1:.1f}" stroke="#d62728" '
                         'stroke-width="4"/>')
            parts.append(f'<text x="{x - 4:.1f}" y="{plot.top + 12}" text-anchor="end" fill="#d62728" '
                         'font-weight="bold">OOM</text>')
        return "".join(parts) + "</svg>"

    def loss_svg(self, width: int = 640, height: int = 120) -> str:
        """The training loss vs batch (epoch marks), when the steps returned one."""
        losses = [p[LOSS] for p in self.points if math.isfinite(p[LOSS])]  # an inf / nan loss is not drawn
        if not losses:
            return ""
        low, high = min(losses), max(losses)
        pad = (high - low) * 0.08 or abs(high) * 0.1 or 1.0
        plot = _Plot(self.points, width, height, high + pad, 0, ymin=low - pad)
        parts = plot.frame([(low, f"{low:.3g}"), (high, f"{high:.3g}")], label="loss")
        return "".join(parts) + plot.line(LOSS, "#2ca02c") + "</svg>"

    def rate_svg(self, width: int = 640, height: int = 100) -> str:
        """Throughput per step (each timed training sample's samples / seconds), as the live chart's third panel."""
        rated = [p[:SECONDS] + [p[SAMPLES] / p[SECONDS]] + p[SECONDS + 1:] if p[STAGE] == 0 and p[BATCHES] > 0
                 and p[SECONDS] > 0 else p[:SECONDS] + [NAN] + p[SECONDS + 1:] for p in self.points]
        rates = [p[SECONDS] for p in rated if math.isfinite(p[SECONDS])]
        if not rates:
            return ""
        low, high = min(rates), max(rates)
        pad = (high - low) * 0.08 or abs(high) * 0.1 or 1.0
        plot = _Plot(rated, width, height, high + pad, 0, ymin=max(0.0, low - pad))
        parts = plot.frame([(low, f"{low:,.0f}"), (high, f"{high:,.0f}")], label="throughput per step (samples/s)")
        return "".join(parts) + plot.line(SECONDS, "#9467bd") + "</svg>"

    def training_svg(self, width: int = 640) -> str:
        """Loss and throughput per step as one picture of two stacked panels (as in the live chart)."""
        loss, rate = self.loss_svg(width), self.rate_svg(width)
        if not (loss and rate):
            return loss or rate
        inner = [svg[svg.index(">") + 1: -len("</svg>")] for svg in (loss, rate)]  # each without its <svg> tag
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="220" font-family="sans-serif" '
                f'font-size="10">{inner[0]}<g transform="translate(0,120)">{inner[1]}</g></svg>')

    def html(self) -> str:
        lines = self.lines()
        legend = ('<div style="font-size:11px"><span style="color:#1f77b4">━ InUse</span> '
                  '<span style="color:#ff7f0e">━ MaxInUse</span> <span style="color:#d62728">┅ Limit</span> '
                  '<span style="color:#2ca02c">━ training loss</span> '
                  '<span style="color:#9467bd">━ samples/s per step</span> '
                  '<span style="color:#999">┆ epoch</span></div>')
        body = "<br>".join(html.escape(line) for line in lines[1:])
        training = self.training_svg()
        charts = self.memory_svg() + ("<br>" + training if training else "")
        return (f'<div class="hpu-memory-summary" style="font-family:sans-serif;font-size:12px">'
                f"<b>{html.escape(lines[0])}</b><br>{body}<br>{charts}{legend if self.points else ''}</div>")


class _Plot:
    """Coordinates and frame of one static SVG chart over the batch axis."""

    left, right, top, bottom = 70, 10, 10, 22

    def __init__(self, points: list[list[float]], width: int, height: int, ymax: float, x_extra: float,
                 ymin: float = 0.0) -> None:
        self.points, self.width, self.height, self.ymax, self.ymin = points, width, height, ymax, ymin
        self.w, self.h = width - self.left - self.right, height - self.top - self.bottom
        self.x0 = points[0][X]
        self.x1 = max(points[-1][X], x_extra, self.x0 + 1)

    def sx(self, x: float) -> float:
        return self.left + self.w * (x - self.x0) / (self.x1 - self.x0)

    def sy(self, y: float) -> float:
        return self.top + self.h * (1 - (y - self.ymin) / (self.ymax - self.ymin))

    def frame(self, ticks: list[tuple[float, str]], label: str = "") -> list[str]:
        parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{self.height}" '
                 f'font-family="sans-serif" font-size="10">',
                 f'<rect x="{self.left}" y="{self.top}" width="{self.w}" height="{self.h}" fill="#fafafa" '
                 'stroke="#ddd"/>']
        for y, text in ticks:
            parts.append(f'<text x="{self.left - 4}" y="{self.sy(y) + 3:.1f}" text-anchor="end">{html.escape(text)}'
                         "</text>")
        if label:
            parts.append(f'<text x="{self.left + 4}" y="{self.top + 11}" fill="#555">{label}</text>')
        parts.append(f'<text x="{self.left}" y="{self.height - 6}">batch {self.x0:g}</text>')
        parts.append(f'<text x="{self.left + self.w}" y="{self.height - 6}" text-anchor="end">{self.x1:g}</text>')
        for a, b in zip(self.points, self.points[1:]):
            if b[EPOCH] != a[EPOCH]:
                x = self.sx(b[X])
                parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{self.top}" y2="{self.top + self.h}" '
                             'stroke="#999" stroke-dasharray="2,3"/>')
        return parts

    def line(self, column: int, colour: str, dash: str = "") -> str:
        pts = " ".join(f"{self.sx(p[X]):.1f},{self.sy(p[column]):.1f}" for p in self.points
                       if math.isfinite(p[column]))
        return f'<polyline fill="none" stroke="{colour}" stroke-width="1.6" {dash} points="{pts}"/>'


def _loss_of(outputs: Any) -> Any:
    """The loss a training step returned (a tensor, or a dict's "loss"), detached; NaN when there is none."""
    if isinstance(outputs, dict):
        outputs = outputs.get("loss")
    detach = getattr(outputs, "detach", None)
    if detach is not None and getattr(outputs, "numel", lambda: 0)() == 1:
        return detach()
    if isinstance(outputs, (int, float)):
        return float(outputs)
    return NAN


def _as_float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        return NAN


def _size_of(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor (0 when it has none)."""
    from hpu_nb.runtime.base import iter_tensors

    for tensor in iter_tensors(batch):
        return int(tensor.shape[0]) if tensor.dim() else 1
    return 0


def _backend_label() -> tuple[str, bool]:
    from hpu_nb.runtime import get_backend

    try:
        backend = get_backend()
        name = backend.device_name()
        label = f"emulated {name} on the CPU" if backend.is_emulated else f"Intel Gaudi {name}"
        return label, bool(backend.is_emulated)
    except Exception as err:
        return f"device unknown ({type(err).__name__})", False


def _stage_index(stage: str) -> int:
    return STAGES.index(stage) if stage in STAGES else 0


def _is_hpu(trainer: Any) -> bool:
    from hpu_nb.core.accelerator import HPUAccelerator

    return isinstance(getattr(trainer, "accelerator", None), HPUAccelerator)


def _execution_count() -> int | None:
    """The running cell's number in IPython; None outside IPython (then nothing is displayed automatically)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return None if shell is None else int(getattr(shell, "execution_count", 0))

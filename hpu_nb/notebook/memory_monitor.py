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

This module holds the callback; its parts live in hpu_nb.notebook.memory (history, packing, oom, chart_widget, summary,
svg, relay, planned) and their names stay importable from here.
"""

from __future__ import annotations

import math
import multiprocessing
import numbers
import os
import time
import uuid
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from IPython import get_ipython
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from hpu_nb.core.accelerator import HPUAccelerator
from hpu_nb.core.strategy_parts.interrupts import FitInterrupted
from hpu_nb.notebook.memory.chart_widget import STATIC, TrainingChart
from hpu_nb.notebook.memory.history import (
    BATCHES,
    EPOCH,
    FIELDS,
    IN_USE,
    LIMIT,
    LOSS,
    MAX_IN_USE,
    NAN,
    SAMPLES,
    SECONDS,
    STAGE,
    STAGES,
    ChartHistory,
    X,
    as_float,
)
from hpu_nb.notebook.memory.oom import oom_figures
from hpu_nb.notebook.memory.packing import pack_points, unpack_points
from hpu_nb.notebook.memory.planned import plan_reference
from hpu_nb.notebook.memory.relay import WorkerRelay
from hpu_nb.notebook.memory.summary import TrainingSummary
from hpu_nb.notebook.snapshot import SnapshotDisplays, live_bundle, snapshot_bundle
from hpu_nb.runtime import get_backend, is_out_of_memory
from hpu_nb.runtime.base import iter_tensors

__all__ = ["BATCHES", "EPOCH", "FIELDS", "IN_USE", "LIMIT", "LOG_PREFIX", "LOSS", "MAX_IN_USE", "SAMPLES", "SECONDS",
           "STAGE", "STAGES", "STATIC", "X", "ChartHistory", "MemoryMonitor", "TrainingChart", "TrainingSummary",
           "oom_figures", "pack_points", "unpack_points"]

LOG_PREFIX = "DeviceStatsMonitor"  # logged keys match Lightning's DeviceStatsMonitor: DeviceStatsMonitor.<hook>/<key>
STOPPED = "stopped"  # the run's status when the user interrupted it (the chart says "stopped by you", not "error")
MAX_RANK_POINTS = 240  # per-rank samples kept (they come every log_every_n_steps)
ALL_GATHER_DEPRECATED = r"torch\.distributed\.nn\.functional\.all_gather is deprecated"


def _checked_update_interval(value: Any) -> float:
    """A real, finite number of seconds >= 0: NaN or inf would hold every chart update back to the run's end, and a
    string or None would fail later with a message naming no argument."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"MemoryMonitor(update_interval=...) must be a number of seconds (int or float, finite, >= 0), "
                        f"got {value!r} of type {type(value).__name__}.")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"MemoryMonitor(update_interval=...) must be a finite number of seconds >= 0, got {value!r}.")
    return seconds


def _checked_max_points(value: Any) -> int:
    """An integer; its range (at least 4) is ChartHistory's to check."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"MemoryMonitor(max_points=...) must be an integer >= 4 (the points the chart keeps), "
                        f"got {value!r} of type {type(value).__name__}.")
    return int(value)


class MemoryMonitor(Callback):
    """Live device memory, loss and throughput of a Trainer:
    `L.Trainer(accelerator="hpu", callbacks=[MemoryMonitor()])`.

    It shows its chart in the cell that trains (unless it was already shown there); display the monitor yourself to
    put the chart elsewhere. `reset_peak=True` resets the device's MaxInUse when a run starts, so the peak is this
    run's. `plan=hpu_nb.plan(model, batch, ...)` draws the plan's predicted per-card peak beside the measured MaxInUse
    and gives a live MFU: the plan's FLOPs per step / the measured step time / the generation's peak FLOP/s.
    """

    def __init__(self, update_interval: float = 0.25, max_points: int = 600, log_to_logger: bool = True,
                 auto_display: bool = True, reset_peak: bool = True, plan: Any = None) -> None:  # an hpu_nb.plan.Plan
        self.plan_reference = plan_reference(plan)
        self.update_interval = _checked_update_interval(update_interval)
        self.history = ChartHistory(_checked_max_points(max_points))
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
            self._finish(STOPPED if _stopped_by_user(exception) else "error")

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
        # several ranks: their memory at every logged step, and at the first step, so each rank's line starts with
        # the first training sample rather than at step log_every_n_steps (50 by default). Every rank decides alike
        # (the same global_step): the gather is a collective.
        step = trainer.global_step
        if getattr(trainer, "world_size", 1) > 1 and (step == 1 or step % max(trainer.log_every_n_steps, 1) == 0):
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
                                   delta={"seq": 0, "base": 0, "reset": True, "points": pack_points([])},
                                   planned=self._planned_traits())
        self.chart.on_msg(_weakly(self, "_on_frontend_msg"))
        self.chart.show_with_snapshot = _weakly(self, "_ipython_display_")

    def _push(self, force: bool = False) -> None:
        """Send the new points and the current counters in one message."""
        if self._relayed:
            for point in self._relayed:
                point[LOSS] = as_float(point[LOSS])
            self._send_to_kernel("points", points=self._relayed, current=dict(self.current))
            self._relayed = []
        if not (force or self._pending or self._needs_reset):
            return
        self._last_push = time.monotonic()
        for point in self._pending:  # losses stay tensors until now: one device sync per push, not per batch
            point[LOSS] = as_float(point[LOSS])
        traits: dict[str, Any] = {"current": dict(self.current)}
        if self.plan_reference is not None:
            traits["planned"] = self._planned_traits()
        if self._pending or self._needs_reset:
            if self._needs_reset:
                for point in self.history.points:
                    point[LOSS] = as_float(point[LOSS])
            base = self._seq
            self._seq += 1
            points = self.history.points if self._needs_reset else self._pending
            traits["delta"] = {"seq": self._seq, "base": base, "reset": self._needs_reset,
                               "points": pack_points(points)}
            self._pending, self._needs_reset = [], False
        self._guard(self._set, **traits)

    def _planned_traits(self) -> dict[str, Any]:
        """The chart's `planned` trait: the plan's peak and the MFU of the steps timed so far (empty without a plan)."""
        if self.plan_reference is None:
            return {}
        training = TrainingSummary(self).training() or {}
        return self.plan_reference.chart_traits(training.get("step_time"))

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

        The chart outlives the run (ipywidgets keeps every live widget) but holds this monitor only through a
        weakref.proxy (`_weakly`), so a monitor nobody keeps is collected with its run. A monitor the notebook
        keeps (`monitor = MemoryMonitor()`) would still hold the model, Trainer and device memory through these two.
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
        relay = WorkerRelay(self, receiving)
        self._worker_status, self.detached = None, None
        self._start_run("")
        self._push(force=True)
        relay.start()
        try:
            yield
        except BaseException as err:
            self._stop_relay(relay)
            if self._worker_status == "oom":
                self._finish("oom")
            elif _stopped_by_user(err):  # the user's interrupt: not an error of the run
                self._finish(STOPPED)
            raise
        self._stop_relay(relay)
        self._finish(self._worker_status or "done")

    def _stop_relay(self, relay: WorkerRelay) -> None:
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


def _weakly(monitor: MemoryMonitor, method: str) -> Callable[..., bool]:
    """`monitor.<method>(...)` through a weakref.proxy, for the chart's message handler and display (as tqdm.notebook's
    container holds its bar): the chart, kept by ipywidgets for as long as the kernel runs, does not keep the monitor
    alive. Returns False, doing nothing, once the monitor was collected."""
    weak = weakref.proxy(monitor)

    def call(*args: Any) -> bool:
        try:
            bound = getattr(weak, method)
        except ReferenceError:
            return False
        bound(*args)
        return True

    return call


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


def _size_of(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor (0 when it has none)."""
    for tensor in iter_tensors(batch):
        return int(tensor.shape[0]) if tensor.dim() else 1
    return 0


def _backend_label() -> tuple[str, bool]:
    """(the chart's device label, whether the device is emulated): the backend's own device_label()."""
    try:
        backend = get_backend()
        return backend.device_label(), bool(backend.is_emulated)
    except Exception as err:
        return f"device unknown ({type(err).__name__})", False


def _stage_index(stage: str) -> int:
    return STAGES.index(stage) if stage in STAGES else 0


def _is_hpu(trainer: Any) -> bool:
    return isinstance(getattr(trainer, "accelerator", None), HPUAccelerator)


def _execution_count() -> int | None:
    """The running cell's number in IPython; None outside IPython (then nothing is displayed automatically)."""
    shell = get_ipython()
    return None if shell is None else int(getattr(shell, "execution_count", 0))


def _stopped_by_user(exception: BaseException) -> bool:
    """A Ctrl-C / the notebook's interrupt: KeyboardInterrupt in the process that trains, FitInterrupted (one line)
    from hpu_nb's multi-card launcher."""
    return isinstance(exception, (KeyboardInterrupt, FitInterrupted))

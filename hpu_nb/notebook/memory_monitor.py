"""MemoryMonitor: a Lightning callback that is also a live chart of the device memory (Limit, InUse, MaxInUse).

Why not DeviceStatsMonitor: it needs a logger and shows nothing in the notebook. This samples
`trainer.accelerator.get_device_stats()` at the end of every batch (fit / validate / test / predict), keeps a
bounded history (downsampled two-to-one when full, always keeping the higher point, so the peak survives), and
sends the front end only the points added since the last update, at most every `update_interval` seconds, in
one message (`hold_sync`). It also logs to the Trainer's loggers under DeviceStatsMonitor's keys. A widget or
front-end failure is reported once and never stops training. Without a front end (nbmake, plain IPython) the
output holds a text / HTML summary with a static SVG chart: peak, limit, headroom, and an out-of-memory marker.

The chart is an anywidget whose JavaScript ships in `hpu_nb/notebook/static/` (no CDN). bqplot would also work
offline, but it re-sends whole arrays on every update (no deltas) and adds a dependency; this chart is ~300
lines of plain SVG code.
"""

from __future__ import annotations

import html
import logging
from array import array
import os
import re
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

import anywidget
import traitlets
from lightning.pytorch.callbacks import Callback

from hpu_nb.runtime import is_out_of_memory
from hpu_nb.runtime.env import format_bytes

STATIC = Path(__file__).parent / "static"
SERIES = ("Limit", "InUse", "MaxInUse")
STAGES = ("train", "validate", "sanity_check", "test", "predict")
_WIDGET_LOG = logging.getLogger("hpu_nb.notebook.memory_monitor")
LOG_PREFIX = "DeviceStatsMonitor"  # logged keys match Lightning's DeviceStatsMonitor: DeviceStatsMonitor.<hook>/<key>


class MemoryHistory:
    """Bounded list of samples (x, Limit, InUse, MaxInUse, stage); halves itself when full, keeping the peak."""

    def __init__(self, max_points: int = 600) -> None:
        if max_points < 4:
            raise ValueError(f"max_points must be at least 4, got {max_points}.")
        self.max_points = max_points
        self.points: list[list[int]] = []
        self.compactions = 0

    def __len__(self) -> int:
        return len(self.points)

    def append(self, point: list[int]) -> bool:
        """Add a sample; returns True when the history was downsampled (the front end then needs all of it)."""
        self.points.append(point)
        if len(self.points) <= self.max_points:
            return False
        pts = self.points
        kept = [a if a[2] >= b[2] else b for a, b in zip(pts[0::2], pts[1::2])]
        if len(pts) % 2:
            kept.append(pts[-1])
        for merged, (a, b) in zip(kept, zip(pts[0::2], pts[1::2])):
            merged[3] = max(a[3], b[3])  # MaxInUse of the pair: never lose a peak
        self.points = kept
        self.compactions += 1
        return True

    def clear(self) -> None:
        self.points = []

    @property
    def peak(self) -> int:
        return max((p[3] for p in self.points), default=0)


POINT_FIELDS = 5  # x, Limit, InUse, MaxInUse, stage


def pack_points(points: list[list[int]]) -> memoryview:
    """Points as one binary buffer of float64 (exact for byte counts below 2**53): no per-number JSON work."""
    flat = array("d")
    for point in points:
        flat.extend(point)
    return memoryview(flat.tobytes())


def unpack_points(buffer: Any) -> list[list[int]]:
    """The inverse of pack_points (what the front end does with the buffer)."""
    flat = array("d")
    flat.frombytes(bytes(buffer))
    return [[int(v) for v in flat[i:i + POINT_FIELDS]] for i in range(0, len(flat), POINT_FIELDS)]


def _parse_requested(message: str) -> int | None:
    """Bytes an out-of-memory error says were asked for (emulated Gaudi or Habana runtime wording)."""
    for pattern in (r"tried to allocate [^(]*\((\d+) bytes\)", r"size::(\d+)", r"allocate (\d+) bytes"):
        match = re.search(pattern, message)
        if match:
            return int(match.group(1))
    return None


class MemorySummary:
    """Text, HTML and a static SVG chart of a monitor's state: what stays in the output without a front end."""

    def __init__(self, monitor: "MemoryMonitor") -> None:
        self.points = [list(p) for p in monitor.history.points]
        self.current = dict(monitor.current)
        self.device_label = monitor.device_label
        self.stage = monitor.stage
        self.status = monitor.status
        self.oom = dict(monitor.oom)
        self.samples = monitor.samples
        self.error = monitor.frontend_error

    @property
    def limit(self) -> int | None:
        return self.current.get("Limit") or (self.points[-1][1] if self.points else None)

    @property
    def peak(self) -> int:
        return max([p[3] for p in self.points] + [self.current.get("MaxInUse", 0)])

    def lines(self) -> list[str]:
        head = f"MemoryMonitor — {self.device_label}"
        if self.status == "idle" and not self.points:
            return [head, "No samples yet: pass it to a Trainer as a callback (callbacks=[monitor]) and fit."]
        lines = [f"{head} — {self.stage or 'run'}: {self.samples} batches sampled ({self.status})"]
        if "InUse" not in self.current:
            lines.append(f"This accelerator reports no HPU memory counters: {sorted(self.current)}")
            return lines
        limit, peak = self.limit or 0, self.peak
        headroom = limit - peak
        pct = 100.0 * headroom / limit if limit else 0.0
        if self.oom:
            needed = self.oom["in_use"] + (self.oom.get("requested") or 0)
            lines.append(
                f"Peak (MaxInUse) {format_bytes(peak)} of Limit {format_bytes(limit)}: no headroom — the run needed "
                f"at least {format_bytes(needed)}, {format_bytes(max(needed - limit, 0))} more than the Limit"
            )
        else:
            lines.append(
                f"Peak (MaxInUse) {format_bytes(peak)} of Limit {format_bytes(limit)}: "
                f"headroom {format_bytes(headroom)} ({pct:.1f}% free)"
            )
        lines.append("Now: " + ", ".join(
            f"{k} {format_bytes(v) if k in ('InUse', 'MaxAllocSize') else v}"
            for k, v in self.current.items() if k not in ("Limit", "MaxInUse")
        ))
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

    def svg(self, width: int = 640, height: int = 180) -> str:
        """A static chart of InUse / MaxInUse (and Limit when in scale) vs batch, with the OOM marker."""
        if not self.points:
            return ""
        pad_l, pad_r, pad_t, pad_b = 70, 10, 10, 22
        w, h = width - pad_l - pad_r, height - pad_t - pad_b
        limit, peak = self.limit or 1, self.peak
        top = max(peak, self.oom.get("in_use", 0) + (self.oom.get("requested") or 0))
        show_limit = bool(self.oom) or top >= 0.05 * limit
        ymax = max(limit if show_limit else top, top, 1) * 1.08
        x0, x1 = self.points[0][0], max(self.points[-1][0], self.oom.get("x", 0), self.points[0][0] + 1)

        def sx(x: float) -> float:
            return pad_l + w * (x - x0) / (x1 - x0)

        def sy(y: float) -> float:
            return pad_t + h * (1 - y / ymax)

        def line(col: int, colour: str, dash: str = "") -> str:
            pts = " ".join(f"{sx(p[0]):.1f},{sy(p[col]):.1f}" for p in self.points)
            return f'<polyline fill="none" stroke="{colour}" stroke-width="1.6" {dash} points="{pts}"/>'

        parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                 f'font-family="sans-serif" font-size="10">',
                 f'<rect x="{pad_l}" y="{pad_t}" width="{w}" height="{h}" fill="#fafafa" stroke="#ddd"/>']
        for frac in (0, 0.5, 1):
            y = ymax / 1.08 * frac
            parts.append(f'<text x="{pad_l - 4}" y="{sy(y) + 3:.1f}" text-anchor="end">{format_bytes(y)}</text>')
        parts.append(f'<text x="{pad_l}" y="{height - 6}">batch {x0}</text>')
        parts.append(f'<text x="{pad_l + w}" y="{height - 6}" text-anchor="end">{x1}</text>')
        if show_limit:
            parts.append(line(1, "#d62728", 'stroke-dasharray="5,3"'))
        else:
            parts.append(f'<text x="{pad_l + 6}" y="{pad_t + 12}" fill="#d62728">Limit {format_bytes(limit)} '
                         "(off scale)</text>")
        parts.append(line(3, "#ff7f0e"))
        parts.append(line(2, "#1f77b4"))
        if self.oom:
            x, y0 = sx(self.oom["x"]), sy(self.oom["in_use"])
            y1 = sy(self.oom["in_use"] + (self.oom.get("requested") or 0))
            parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y0:.1f}" y2="{max(y1, pad_t):.1f}" '
                         'stroke="#d62728" stroke-width="4"/>')
            parts.append(f'<text x="{x - 4:.1f}" y="{pad_t + 12}" text-anchor="end" fill="#d62728" '
                         'font-weight="bold">OOM</text>')
        parts.append("</svg>")
        return "".join(parts)

    def html(self) -> str:
        lines = self.lines()
        legend = ('<div style="font-size:11px"><span style="color:#1f77b4">━ InUse</span> '
                  '<span style="color:#ff7f0e">━ MaxInUse</span> <span style="color:#d62728">┅ Limit</span></div>')
        body = "<br>".join(html.escape(line) for line in lines[1:])
        return (f'<div class="hpu-memory-summary" style="font-family:sans-serif;font-size:12px">'
                f"<b>{html.escape(lines[0])}</b><br>{body}{self.svg()}{legend if self.points else ''}</div>")


class MemoryMonitor(Callback, anywidget.AnyWidget):
    """Live device-memory chart for a Trainer: `L.Trainer(accelerator="hpu", callbacks=[MemoryMonitor()])`.

    It shows itself in the cell that trains (unless it was already shown there); display it yourself (`monitor`)
    to put the chart elsewhere. `reset_peak=True` resets the device's MaxInUse when a run starts, so the peak
    is this run's.
    """

    _esm = STATIC / "memory_chart.js"
    _css = STATIC / "memory_chart.css"

    uid = traitlets.Unicode().tag(sync=True)
    delta = traitlets.Dict().tag(sync=True)  # {"seq", "base", "reset", "points": pack_points([[x, Limit, InUse, MaxInUse, stage]])}
    current = traitlets.Dict().tag(sync=True)  # the latest counters (all ten)
    status = traitlets.Unicode("idle").tag(sync=True)  # idle | running | done | oom | error
    stage = traitlets.Unicode("").tag(sync=True)
    device_label = traitlets.Unicode("").tag(sync=True)
    is_emulated = traitlets.Bool(False).tag(sync=True)
    oom = traitlets.Dict().tag(sync=True)  # {"x", "in_use", "limit", "requested", "message", "stage"}
    summary = traitlets.Unicode("").tag(sync=True)
    stages = traitlets.List(list(STAGES)).tag(sync=True)

    # ipywidgets keeps a `log` Logger trait; Lightning assigns `callback.log = pl_module.log` to every callback.
    # Both get what they expect: reading gives the widget's logger, assigning keeps Lightning's function apart.
    @property
    def log(self) -> logging.Logger:
        return _WIDGET_LOG

    @log.setter
    def log(self, fn: Any) -> None:
        self.lightning_log = fn

    def __init__(self, update_interval: float = 0.25, max_points: int = 600, log_to_logger: bool = True,
                 auto_display: bool = True, reset_peak: bool = True) -> None:
        if update_interval < 0:
            raise ValueError(f"update_interval must be >= 0 seconds, got {update_interval}.")
        # uid and the first delta go with the widget's opening message: the front end keys its history by uid
        super().__init__(uid=uuid.uuid4().hex, delta={"seq": 0, "base": 0, "reset": True, "points": pack_points([])})
        self.update_interval = float(update_interval)
        self.history = MemoryHistory(max_points)
        self.log_to_logger = log_to_logger
        self.auto_display = auto_display
        self.reset_peak = reset_peak
        self.samples = 0
        self.frontend_error: str | None = None
        self._seq = 0
        self._pending: list[list[int]] = []
        self._needs_reset = False
        self._last_push = 0.0
        self._handles: list[Any] = []
        self._shown_in: int | None = None
        self._finished = True
        self._owner_pid = os.getpid()
        self.detached: str | None = None  # why this process must not talk to the front end (a worker process)
        self._describe_backend()
        self.on_msg(self._on_frontend_msg)

    # -- Lightning hooks --------------------------------------------------------------------------------------
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        # In a forked / spawned worker (multi-device runs) the kernel's sockets are not ours to write to.
        if os.getpid() != self._owner_pid or getattr(trainer, "global_rank", 0) != 0:
            self.detached = f"rank {getattr(trainer, 'global_rank', '?')} in worker process {os.getpid()}"
        self.history.clear()
        self._pending, self._needs_reset, self.samples = [], True, 0
        self._finished = False
        self._describe_backend()
        if self.reset_peak and _is_hpu(trainer):
            from hpu_nb.runtime import get_backend

            get_backend().reset_peak_memory_stats()
        self._guard(self._set, status="running", stage=str(getattr(stage, "value", stage)), oom={}, summary="")
        if self.auto_display and self.detached is None:
            self._guard(self._show_in_current_cell)
        self._sample(trainer, None, record=True)  # the starting point: parameters already on the device
        self._push(force=True)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._finish("done" if not self.oom else "oom")

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        message = str(exception)
        if is_out_of_memory(exception) or "out of memory" in message.lower():
            stats = self._sample(trainer, None, record=True) or dict(self.current)
            self._guard(self._set, oom={
                "x": self.history.points[-1][0] if self.history.points else 0,
                "in_use": int(stats.get("InUse", 0)),
                "limit": int(stats.get("Limit", 0)),
                "requested": _parse_requested(message),
                "message": message[:500],
                "stage": self._stage_name(trainer),
            })
            self._finish("oom")
        else:
            self._finish("error")

    def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
        self._sample(trainer, "on_train_batch_start", record=False)

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        self._sample(trainer, "on_train_batch_end")

    def on_validation_batch_start(self, trainer: Any, *args: Any) -> None:
        self._sample(trainer, "on_validation_batch_start", record=False)

    def on_validation_batch_end(self, trainer: Any, *args: Any) -> None:
        self._sample(trainer, "on_validation_batch_end")

    def on_test_batch_start(self, trainer: Any, *args: Any) -> None:
        self._sample(trainer, "on_test_batch_start", record=False)

    def on_test_batch_end(self, trainer: Any, *args: Any) -> None:
        self._sample(trainer, "on_test_batch_end")

    def on_predict_batch_end(self, trainer: Any, *args: Any) -> None:
        self._sample(trainer, "on_predict_batch_end")

    # -- sampling ---------------------------------------------------------------------------------------------
    def _sample(self, trainer: Any, hook: str | None, record: bool = True) -> dict[str, Any] | None:
        if not record and not (self.log_to_logger and trainer.loggers):
            return None  # batch-start samples only feed the loggers
        try:
            stats = trainer.accelerator.get_device_stats(trainer.strategy.root_device)
        except Exception as err:  # noqa: BLE001 - a monitor must never stop training
            self._disable(f"get_device_stats failed: {type(err).__name__}: {err}")
            return None
        if hook is not None and self.log_to_logger and trainer.loggers:
            self._log(trainer, hook, stats)
        if not record:
            return stats
        if "InUse" in stats:
            self.samples += 1
            point = [self.samples, int(stats.get("Limit", 0)), int(stats["InUse"]),
                     int(stats.get("MaxInUse", stats["InUse"])), _stage_index(self._stage_name(trainer))]
            if self.history.append(point):
                self._needs_reset = True
                self._pending = []
            else:
                self._pending.append(point)
        self._latest = stats
        if time.monotonic() - self._last_push >= self.update_interval:
            self._push()
        return stats

    def _log(self, trainer: Any, hook: str, stats: dict[str, Any]) -> None:
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
        except Exception:  # noqa: BLE001
            return ""

    # -- front end --------------------------------------------------------------------------------------------
    def _push(self, force: bool = False) -> None:
        """Send the new points and the current counters in one message."""
        if not (force or self._pending or self._needs_reset):
            return
        self._last_push = time.monotonic()
        traits: dict[str, Any] = {
            "current": {k: int(v) if isinstance(v, (int, float)) else v for k, v in getattr(self, "_latest", {}).items()}
        }
        if self._pending or self._needs_reset:
            base = self._seq
            self._seq += 1
            points = self.history.points if self._needs_reset else self._pending
            traits["delta"] = {"seq": self._seq, "base": base, "reset": self._needs_reset,
                               "points": pack_points(points)}
            self._pending, self._needs_reset = [], False
        self._guard(self._set, **traits)

    def _set(self, **traits: Any) -> None:
        with self.hold_sync():
            for name, value in traits.items():
                setattr(self, name, value)

    def _on_frontend_msg(self, widget: Any, content: Any, buffers: Any) -> None:
        """A view that missed deltas (created mid-run, page reloaded) asks for the whole history."""
        if isinstance(content, dict) and content.get("type") == "sync":
            self._needs_reset = True
            self._push(force=True)

    def _finish(self, status: str) -> None:
        if self._finished:
            return
        self._finished = True
        self._needs_reset = True
        self._push(force=True)
        summary = MemorySummary(self)
        summary.status = status
        self._guard(self._set, status=status, summary=summary.text())
        if self.detached is None:
            self._guard(self._update_displays)

    def _send(self, msg: Any, buffers: Any = None) -> None:
        """After a front-end failure the Python side keeps its state but sends nothing more."""
        if getattr(self, "frontend_error", None) is None and getattr(self, "detached", None) is None:
            super()._send(msg, buffers)  # (also called while the widget is being built)

    def _guard(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        """Run a front-end operation; on failure say so once and stop sending to the front end."""
        try:
            fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - never let the widget stop training
            self._disable(f"{type(err).__name__}: {err}")

    def _disable(self, reason: str) -> None:
        if self.frontend_error is None:
            self.frontend_error = reason
            warnings.warn(f"MemoryMonitor stopped updating its chart ({reason}); training goes on.", RuntimeWarning,
                          stacklevel=3)

    def _describe_backend(self) -> None:
        from hpu_nb.runtime import get_backend

        try:
            backend = get_backend()
            name = backend.device_name()
            label = f"emulated {name} on the CPU" if backend.is_emulated else f"Intel Gaudi {name}"
            self._guard(self._set, device_label=label, is_emulated=backend.is_emulated)
        except Exception as err:  # noqa: BLE001
            self.device_label = f"device unknown ({type(err).__name__})"

    # -- display ----------------------------------------------------------------------------------------------
    def _bundle(self) -> dict[str, Any]:
        data, _ = anywidget.AnyWidget._repr_mimebundle_(self)  # the widget view
        summary = MemorySummary(self)
        data["text/plain"] = summary.text()
        data["text/html"] = summary.html()
        return data

    def _ipython_display_(self) -> None:
        from IPython.display import display

        handle = display(self._bundle(), raw=True, display_id=True)
        if handle is not None:
            self._handles = (self._handles + [handle])[-4:]
        self._shown_in = _execution_count()

    def _show_in_current_cell(self) -> None:
        count = _execution_count()
        if count is None or count == self._shown_in:
            return
        self._ipython_display_()

    def _update_displays(self) -> None:
        if not self._handles:
            return
        bundle = self._bundle()
        for handle in self._handles:
            handle.update(bundle, raw=True)

    def __repr__(self) -> str:
        if "history" not in self.__dict__:  # still being constructed
            return object.__repr__(self)
        return MemorySummary(self).text()

    def _repr_html_(self) -> str:
        return MemorySummary(self).html()

    @property
    def peak(self) -> int:
        """The highest MaxInUse seen in the last run, in bytes."""
        return MemorySummary(self).peak

    @property
    def headroom(self) -> int | None:
        """Limit minus the peak, in bytes (None before any sample)."""
        limit = MemorySummary(self).limit
        return None if limit is None else limit - self.peak


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

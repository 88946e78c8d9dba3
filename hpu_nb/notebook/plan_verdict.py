"""The config widget's live plan: "estimated peak X of Y per card on N × Gaudi 2: fits" as the user clicks.

A form change asks for a plan; the request waits a short quiet time (a burst of clicks plans once, for the last
state), then `hpu_nb.plan` runs on a worker thread, one plan at a time, so the form never waits for it (planning a
small model takes about a second). A plan whose form state was overtaken is dropped. The planned model is a private
copy taken when the widget was given it (the trace swaps the model's tensors for fake ones while it runs). Planning
happens only between cells: torch's MemTracker and FlopCounterMode, which the trace runs under, hook every module's
forward process-wide, so a plan must never overlap a cell that trains. In IPython a cell that starts waits for the
plan in flight, and a plan due while a cell runs starts when it ends (`pause` / `resume` on IPython's pre_run_cell /
post_run_cell events). Every error of planning (an invalid form, a step fake tensors
cannot run, a strategy the planner does not model) becomes the message shown, never an exception in the form.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any

from torch import nn

from hpu_nb.plan import Plan, plan
from hpu_nb.plan.planner import DEFAULT_MARGIN
from hpu_nb.runtime.env import format_bytes
from hpu_nb.runtime.generations import GENERATIONS

__all__ = ["DEBOUNCE_S", "GENERATION_OPTIONS", "LivePlanner", "verdict_text"]

DEBOUNCE_S = 0.4  # quiet time after the last change before planning (a burst of clicks plans once)
GENERATION_OPTIONS = [(gen.label, key) for key, gen in GENERATIONS.items()]
PLANNING = "Plan (estimate): planning…"


def verdict_text(result: Plan, margin: float = DEFAULT_MARGIN) -> str:
    """One line: the plan's per-card peak against the card's HBM, labelled an estimate. "fits" keeps `margin` of the
    HBM free (what only a card knows: graph workspace, HCCL buffers, allocator rounding); the margin left is said."""
    peak, hbm = result.peak_bytes, result.hbm_bytes
    free = hbm - peak
    where = f"per card on {result.world_size} × {result.generation.label}"
    head = (f"Plan (estimate): peak {format_bytes(peak)} of {format_bytes(hbm)} {where}, "
            f"batch {result.batch_size} per card")
    if peak <= hbm * (1 - margin):
        return f"{head}: fits (margin {format_bytes(free)}, {free / hbm:.0%} of HBM free)"
    if peak <= hbm:
        return (f"{head}: fits only without the {margin:.0%} margin ({format_bytes(free)} free; the graph "
                f"workspace and HCCL buffers are not counted)")
    return f"{head}: does not fit (over by {format_bytes(-free)})"


class LivePlanner:
    """Plans a form state off the kernel's thread and reports a verdict line through `show(text, state)`.

    state is "planning", "done" or "error". `request(kwargs_of)` takes a function giving plan()'s keyword arguments
    (called on the worker, so an invalid form's error is caught there too).
    """

    def __init__(self, model: nn.Module, batch: Any, show: Callable[[str, str], None],
                 debounce_s: float = DEBOUNCE_S) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a LightningModule (an nn.Module), got {type(model).__name__}.")
        if batch is None:
            raise TypeError("batch is needed with model: one per-card batch, a DataLoader or a LightningDataModule.")
        self._model = copy.deepcopy(model)
        self._batch = batch
        self._show = show
        self._debounce_s = debounce_s
        self._lock = threading.Lock()
        self._serial = 0  # the latest request's number: older results are dropped
        self._timer: threading.Timer | None = None
        self._worker: threading.Thread | None = None
        self._pending: tuple[int, Callable[[], dict[str, Any]]] | None = None
        self._idle = threading.Event()
        self._idle.set()
        self._paused = False  # a cell is running: no plan starts until it ends
        self.plan: Plan | None = None
        self.error: str | None = None

    def request(self, kwargs_of: Callable[[], dict[str, Any]]) -> None:
        with self._lock:
            self._serial += 1
            serial = self._serial
            self._idle.clear()
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(self._debounce_s, self._due, args=(serial, kwargs_of))
            self._timer.daemon = True
            self._timer.start()
        self._show(PLANNING, "planning")

    def _due(self, serial: int, kwargs_of: Callable[[], dict[str, Any]]) -> None:
        with self._lock:
            if serial != self._serial:
                return
            self._pending = (serial, kwargs_of)
            self._start_worker()

    def _start_worker(self) -> None:
        """Start a worker for the pending request unless one runs (it takes it next) or a cell runs (called with the
        lock held)."""
        if self._worker is not None or self._paused or self._pending is None:
            return
        self._worker = threading.Thread(target=self._work, name="hpu_nb-config-plan", daemon=True)
        self._worker.start()

    def pause(self, *_: Any) -> None:
        """A cell starts (IPython's pre_run_cell): wait for the plan in flight, start no other until resume()."""
        with self._lock:
            self._paused = True
            worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            worker.join()

    def resume(self, *_: Any) -> None:
        """The cell ended (post_run_cell): a plan that came due meanwhile starts."""
        with self._lock:
            self._paused = False
            self._start_worker()

    def _work(self) -> None:
        while True:
            with self._lock:
                if self._pending is None or self._paused:
                    self._worker = None  # a request due from now on (or at resume) starts a new worker
                    return
                serial, kwargs_of = self._pending
                self._pending = None
            result: Plan | None = None
            try:
                result = plan(self._model, self._batch, **kwargs_of())
                text, state, error = verdict_text(result), "done", None
            except Exception as exc:  # any planning error is the message shown, never the form's
                error = f"{type(exc).__name__}: {exc}"
                text, state = f"Plan (estimate): cannot plan this configuration: {error}", "error"
            with self._lock:
                if serial != self._serial:
                    continue  # the form changed meanwhile: its own request follows
                self.plan, self.error = result, error
            self._show(text, state)
            with self._lock:
                if serial == self._serial:
                    self._idle.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the latest request is planned (for scripts and tests; the form never calls it). Called from a
        running cell, it lets the plan run: the cell waits, so nothing trains meanwhile."""
        with self._lock:
            paused, self._paused = self._paused, False
            self._start_worker()
        try:
            return self._idle.wait(timeout)
        finally:
            with self._lock:
                self._paused = paused

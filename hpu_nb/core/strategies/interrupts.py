"""A notebook's interrupt of a forked multi-card fit: the workers stop together at a step boundary, hand their weights
back as at the end of a fit, and the cell ends with one line (issue 31, item 4).

How an interrupt arrives: Jupyter interrupts a kernel by sending SIGINT to its process group (jupyter_client's
`LocalProvisioner.send_signal`, ipykernel's `interrupt_request`), so the kernel and every worker it forked get it at
once. Left alone, each worker raised KeyboardInterrupt wherever it was (one rank mid-collective, the other a step
ahead), torch's process wrapper swallowed it and the worker ended with nothing handed back, while the kernel's
KeyboardInterrupt stopped the workers with SIGTERM (their "Received SIGTERM" lines) and reached Lightning's
`_call_and_handle_interrupt`, which ends with `sys.exit(1)`: `SystemExit: 1` and IPython's "To exit: use 'exit'".

Here instead:
- a worker notes SIGINT (`StopAtStepBoundary`: no exception) and, at the start of each training batch, asks the job's
  c10d store whether a stop was agreed: the first rank that saw the interrupt proposes "stop before batch k + m" (k
  its own batch count, m the batches between two gradient syncs; compare-and-set, so one proposal wins). Each
  synchronised step has every rank in a collective, so no rank can have started batch k + m before the proposal was
  written: all ranks stop before the same batch, with the weights of the same step, which rank 0 hands back (the
  sharded strategies gather them from every rank) as at the end of a fit. One store look-up per batch, no device sync.
- the launching process (`LaunchInterrupt`) keeps waiting for them; a second interrupt, or workers still running
  `grace` seconds after the first (an interrupt during validation or a stuck collective), stops them at once.
- the fit then raises `FitInterrupted`, which IPython shows as its one line. It is a BaseException, as KeyboardInterrupt
  (`except Exception` does not swallow an interrupt), but not a KeyboardInterrupt, which Lightning turns into
  `sys.exit(1)`.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerStatus
from torch.distributed import TCPStore
from typing_extensions import Self, override

from hpu_nb.core.strategy_parts.interrupts import STOP_GRACE_S, FitInterrupted, LaunchInterrupt, stopped_message

__all__ = ["STOP_GRACE_S", "STOP_KEY", "WORKER_STEPS", "FitInterrupted", "LaunchInterrupt", "StopAtStepBoundary",
           "stopped_message"]

STOP_KEY = "hpu_nb/interrupt/stop_before_batch"  # in the job's store: the batch every rank stops before
WORKER_STEPS = "hpu_nb_steps"  # in rank 0's extra results: (steps run, whether an interrupt stopped them there)


# -- in a worker ------------------------------------------------------------------------------------------------------
class _StopNow(BaseException):
    """Raised in every worker at the agreed batch: leaves Lightning's fit loop (caught by `StopAtStepBoundary.wrap`)."""


class StopAtStepBoundary(Callback):
    """In a forked Trainer worker: SIGINT is noted, and the ranks stop together before an agreed training batch."""

    def __init__(self, address: tuple[str, int] | None) -> None:
        self._address = address
        self._store: Any = None
        self._interrupted = False
        self._batches = 0  # training batches started in this fit (the same count on every rank)
        self._stop_before: int | None = None
        self.stopped = False  # the fit ended at the agreed batch

    def install(self, trainer: Any) -> Self:
        """Note SIGINT instead of raising it (main thread only), and follow the trainer's batches."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._note)
        trainer.callbacks.append(self)
        return self

    def _note(self, _signum: int, _frame: Any) -> None:
        self._interrupted = True

    def wrap(self, function: Callable[..., Any], trainer: Any) -> Callable[..., Any]:
        """`function` (the worker's fit), returning normally when the ranks stopped: rank 0 then hands back the weights
        as after a whole fit."""

        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return function(*args, **kwargs)
            except _StopNow:
                self.stopped = True
                trainer.state.status = TrainerStatus.INTERRUPTED
                return None

        return run

    @override
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._batches += 1
        stop_before = self._agreed_stop(max(1, int(getattr(trainer, "accumulate_grad_batches", 1))))
        if stop_before is not None and self._batches >= stop_before:
            raise _StopNow

    def _agreed_stop(self, margin: int) -> int | None:
        if self._stop_before is not None:
            return self._stop_before
        store = self._connect()
        if store is None:
            return None
        try:
            if self._interrupted:  # the first proposal wins; every rank reads the same batch back
                value = store.compare_set(STOP_KEY, "", str(self._batches + margin))
            elif store.check([STOP_KEY]):
                value = store.get(STOP_KEY)
            else:
                return None
        except Exception:  # the store is gone (rank 0 ended): the launching process stops this rank
            return None
        self._stop_before = int(value)
        return self._stop_before

    def _connect(self) -> Any:
        if self._store is None and self._address is not None:
            with contextlib.suppress(Exception):
                self._store = TCPStore(self._address[0], self._address[1], is_master=False,
                                       timeout=timedelta(seconds=10), wait_for_workers=False)
            if self._store is None:
                self._address = None  # no store: no agreed stop (the launching process still ends this rank)
        return self._store

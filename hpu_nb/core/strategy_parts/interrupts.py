"""The launching side of an interrupted multi-card launch, the Trainer's and Fabric's alike: `LaunchInterrupt`
keeps the workers in hand while they stop (a second interrupt, or the grace running out, ends them at once), and
`FitInterrupted` is the one line the cell ends with. How the Trainer's workers agree on the step they stop before is
the Trainer's own (hpu_nb.core.strategies.interrupts, which tells the whole story).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from typing_extensions import Self

__all__ = ["STOP_GRACE_S", "FitInterrupted", "LaunchInterrupt", "stopped_message"]

STOP_GRACE_S = 10.0  # how long the launching process waits for the workers to reach a step boundary


class FitInterrupted(BaseException):
    """The user interrupted a multi-card fit; the message says what the model passed to fit() holds."""

    def _render_traceback_(self) -> list[str]:  # IPython shows these lines in place of a traceback
        return [str(self)]


def _steps(n: int) -> str:
    return f"{n} step{'' if n == 1 else 's'}"


def stopped_message(worker_steps: tuple[int, bool] | None, trainer: bool = True) -> str:
    """The one line: what the interrupt stopped and what the notebook's model now holds. `worker_steps`: rank 0's
    (steps run, whether the interrupt stopped them), None when the workers were ended with nothing handed back;
    `trainer`: a Trainer's fit (else Fabric's launch, whose loop is the user's)."""
    if worker_steps is None and not trainer:
        return "Stopped by you: the workers were ended, and fabric.launch() returned nothing."
    if worker_steps is None:
        return ("Stopped by you outside a training step: the workers were ended there, and the model you passed to"
                " fit() keeps the weights it had before fit().")
    steps, stopped = worker_steps
    if not stopped:
        return (f"Stopped by you as the fit ended: all {_steps(steps)} ran, and the model you passed to fit() has"
                " their weights.")
    if steps == 0:
        return "Stopped by you before the first step: the model you passed to fit() is unchanged."
    return f"Stopped by you after {_steps(steps)}: the model you passed to fit() has the weights of step {steps}."


# -- in the launching process ----------------------------------------------------------------------------------------
class LaunchInterrupt:
    """In the launching process (a notebook's kernel), around a launch: with `graceful`, the first SIGINT is noted and
    the workers get `grace` seconds to stop at a step boundary; a second SIGINT, or the grace running out, ends them
    at once (SIGKILL: they hold nothing that would come back) and raises KeyboardInterrupt in the launch. Without
    `graceful` (Fabric: the training loop is the user's) the first SIGINT does that.

    `stop_watching` is called before the workers are ended (the worker watch would report their deaths as failures).
    """

    def __init__(self, running_pids: Callable[[], list[int]], stop_watching: Callable[[], None], graceful: bool,
                 grace: float = STOP_GRACE_S) -> None:
        self._running_pids, self._stop_watching = running_pids, stop_watching
        self._graceful, self._grace = graceful, grace
        self.requested = False
        self.forced = False
        self._previous: Any = None
        self._timer: threading.Timer | None = None
        self._in_launch = False

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
            self._in_launch = True
        return self

    def __exit__(self, *exc: object) -> None:
        self._in_launch = False
        if self._timer is not None:
            self._timer.cancel()
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _on_sigint(self, _signum: int, _frame: Any) -> None:
        first = not self.requested
        self.requested = True
        if first and self._graceful:
            for pid in self._running_pids():  # a worker outside the kernel's process group gets it too
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGINT)
            self._timer = threading.Timer(self._grace, self._grace_over)
            self._timer.daemon = True
            self._timer.start()
            return
        self._end_workers()
        raise KeyboardInterrupt

    def _grace_over(self) -> None:
        """The workers did not stop at a step boundary in time: end them; if the launch still waits (for a result
        that will not come), interrupt it."""
        if not self._in_launch:
            return
        self._end_workers()
        time.sleep(0.5)  # the launch's join sees them gone and raises on its own
        if self._in_launch:
            os.kill(os.getpid(), signal.SIGINT)

    def _end_workers(self) -> None:
        self.forced = True
        self._stop_watching()
        for pid in self._running_pids():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

"""The Trainer's launchers: Lightning's fork / spawn and script launchers with hpu_nb's fork check and liveness
(hpu_nb.core.strategy_parts.launchers, shared with Fabric), plus what only a Trainer has: its workers stop together at
a step boundary on an interrupt (interrupts.py), the callbacks that follow the workers from the launching process, and
what rank 0 hands back to a notebook: the weights onto its model, and beyond Lightning's trainer state and callback
metrics, the loops' progress (current_epoch, global_step) and the logged metrics (trainer_results.py).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from typing_extensions import override

from hpu_nb.core.strategies import interrupts, trainer_results
from hpu_nb.core.strategy_parts.launchers import ScriptLivenessMixin, WorkerLivenessMixin

__all__ = ["HPUMultiProcessingLauncher", "HPUSubprocessScriptLauncher"]


class HPUMultiProcessingLauncher(WorkerLivenessMixin, _MultiProcessingLauncher):
    """Lightning's fork/spawn launcher for the Trainer, with hpu_nb's fork check and liveness (WorkerLivenessMixin)."""

    @override
    def launch(self, function: Callable[..., Any], *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        self.procs = []  # this launch's workers only: never signal a pid left from an earlier launch
        with _callbacks_following_workers(trainer):
            return super().launch(function, *args, trainer=trainer, **kwargs)

    @override
    def _wrapping_function(
        self, process_idx: int, trainer: Any, function: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> None:
        function = self._worker_function(function)
        if trainer is not None:  # an interrupt stops every rank before the same batch (interrupts.py)
            self._stop = interrupts.StopAtStepBoundary(self._store_address()).install(trainer)
            function = self._stop.wrap(function, trainer)
        return super()._wrapping_function(process_idx, trainer, function, *args, **kwargs)

    @override
    def get_extra_results(self, trainer: Any) -> dict[str, Any]:
        """In rank 0, after its fit: also the steps it ran and whether an interrupt stopped it there, the loops'
        progress and the logged / progress-bar metrics (trainer_results.py)."""
        extra = super().get_extra_results(trainer)
        stop = getattr(self, "_stop", None)
        extra[interrupts.WORKER_STEPS] = (int(trainer.global_step), stop is not None and stop.stopped)
        extra[trainer_results.EXTRA_KEY] = trainer_results.collect(trainer)
        return extra

    @override
    def update_main_process_results(self, trainer: Any, extra: dict[str, Any]) -> None:
        self._worker_steps = extra.pop(interrupts.WORKER_STEPS, None)
        results = extra.pop(trainer_results.EXTRA_KEY, None)
        super().update_main_process_results(trainer, extra)
        if results is not None:
            trainer_results.restore(trainer, results)

    @override
    def _recover_results_in_main_process(self, worker_output: Any, trainer: Any) -> None:
        """The launching process keeps no card: the worker's weights are loaded onto the CPU, where its model lives
        (loading them onto the HPU would acquire a card here, and a later fork would be refused)."""
        io = self._strategy.checkpoint_io
        io.load_checkpoint = functools.partial(io.load_checkpoint, map_location="cpu")
        try:
            super()._recover_results_in_main_process(worker_output, trainer)
        finally:
            del io.load_checkpoint


@contextlib.contextmanager
def _callbacks_following_workers(trainer: Any) -> Iterator[None]:
    """Around a launch, the Trainer's callbacks that follow the workers from this process (a notebook's kernel), e.g.
    MemoryMonitor.workers_launched: no callback hook runs in the launching process otherwise."""
    with contextlib.ExitStack() as stack:
        for callback in getattr(trainer, "callbacks", None) or []:
            if callable(getattr(type(callback), "workers_launched", None)):
                stack.enter_context(callback.workers_launched(trainer))
        yield


class HPUSubprocessScriptLauncher(ScriptLivenessMixin, _SubprocessScriptLauncher):
    """Lightning's script launcher for the Trainer, with hpu_nb's liveness (ScriptLivenessMixin)."""

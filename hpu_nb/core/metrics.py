"""HPUGraphMetrics: Habana's graph-compilation and recipe-cache metrics, logged per epoch.

Many graph compilations after the first epoch mean dynamic shapes (recompiles for every new batch shape): the signal
Gaudi users watch `metric_global("graph_compilation")` for. The callback logs, for each training epoch, what the
runtime reports (hpu_nb.runtime: `DeviceBackend.metrics()`): on a Gaudi Habana's counters; on the emulated Gaudi the
compilations and recompilations of `torch.compile(..., backend="hpu_backend")`. A metric the device does not report is
not logged.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from hpu_nb.runtime import get_backend

__all__ = ["HPUGraphMetrics"]

# (metric, tag) -> logged name
LOGGED = {
    ("graph_compilation", "TotalNumber"): "hpu/graph_compilations",
    ("graph_compilation", "TotalTime"): "hpu/graph_compile_time_us",
    ("graph_compilation", "Recompilations"): "hpu/recompilations",
    ("recipe_cache", "TotalHit"): "hpu/recipe_cache_hits",
    ("recipe_cache", "TotalMiss"): "hpu/recipe_cache_misses",
}


def read_counters() -> dict[str, float]:
    """The LOGGED counters the device reports now (cumulative for the process)."""
    metrics = get_backend().metrics()
    return {name: float(metrics[metric][tag]) for (metric, tag), name in LOGGED.items()
            if isinstance(metrics.get(metric, {}).get(tag), (int, float))}


class HPUGraphMetrics(Callback):
    """Logs per training epoch how many graphs were compiled (and recompiled), and recipe-cache hits / misses.

    `history` keeps one dict per epoch (the same numbers), so a notebook can show them without a logger.
    """

    def __init__(self) -> None:
        self.history: list[dict[str, float]] = []
        self._start: dict[str, float] = {}

    @override
    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._start = read_counters()

    @override
    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        now = read_counters()
        epoch = {name: value - self._start.get(name, 0.0) for name, value in now.items()}
        if not epoch:
            return
        self.history.append(dict(epoch, epoch=float(trainer.current_epoch)))
        pl_module.log_dict(epoch, on_step=False, on_epoch=True, sync_dist=False)

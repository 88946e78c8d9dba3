"""What a notebook's Trainer gets back from its forked workers beyond Lightning's own hand-back.

Lightning's fork / spawn launcher (`_MultiProcessingLauncher._recover_results_in_main_process`) restores the weights,
`trainer.state` and `callback_metrics` in the launching process, but not the loops' progress: after a 2-card fit from
a notebook `trainer.current_epoch` and `trainer.global_step` read 0, and `trainer.logged_metrics` is empty, where a
1-card fit (or a script's rank 0) shows how far the run got. Rank 0 sends the progress of the loop that ran (what a
checkpoint's "loops" entry holds, minus the data loaders' states) and the logged and progress-bar metrics; the
launching process loads them into its own loops and logger connector.
"""

from __future__ import annotations

import io
from typing import Any

import torch
from lightning.fabric.utilities.apply_func import apply_to_collection
from lightning.pytorch.loops.loop import _Loop
from lightning.pytorch.trainer.states import TrainerFn

__all__ = ["EXTRA_KEY", "collect", "restore"]

EXTRA_KEY = "hpu_nb_trainer_results"  # in rank 0's extra results

_LOOPS = {TrainerFn.FITTING: "fit_loop", TrainerFn.VALIDATING: "validate_loop", TrainerFn.TESTING: "test_loop",
          TrainerFn.PREDICTING: "predict_loop"}


def collect(trainer: Any) -> dict[str, Any]:
    """In rank 0 after its run: the running loop's progress, and the logged / progress-bar metrics as bytes (tensors
    are sent as bytes, as Lightning sends the callback metrics, to avoid memory sharing between processes)."""
    name = _LOOPS.get(trainer.state.fn)
    loop_state = None
    if name is not None:
        loop_state = getattr(trainer, name).state_dict()
        own = loop_state.get("state_dict")
        if isinstance(own, dict):  # the data loaders' states: the launching process's loaders never ran
            loop_state["state_dict"] = {k: v for k, v in own.items() if k != "combined_loader"}
    connector = trainer._logger_connector
    return {"loop": name, "loop_state": loop_state,
            "logged_metrics": _to_bytes(connector.logged_metrics),
            "progress_bar_metrics": _to_bytes(connector.progress_bar_metrics)}


def restore(trainer: Any, results: dict[str, Any]) -> None:
    """In the launching process: the worker's loop progress and metrics onto this Trainer."""
    name, loop_state = results.get("loop"), results.get("loop_state")
    if name is not None and loop_state is not None:
        loop = getattr(trainer, name)
        loop.load_state_dict(loop_state)
        _not_restarting(loop)  # loaded to be read, not to resume: the loop did not stop half-way here
    connector = trainer._logger_connector
    connector._logged_metrics.update(_from_bytes(results["logged_metrics"]))
    connector._progress_bar_metrics.update(_from_bytes(results["progress_bar_metrics"]))


def _not_restarting(loop: _Loop) -> None:
    """`_Loop.load_state_dict` marks the loop and its children as resuming from a checkpoint; these are not."""
    loop.on_iteration_done()
    for child in vars(loop).values():
        if isinstance(child, _Loop):
            _not_restarting(child)


def _to_bytes(metrics: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(apply_to_collection(dict(metrics), torch.Tensor, lambda t: t.detach().cpu()), buffer)
    return buffer.getvalue()


def _from_bytes(data: bytes) -> dict[str, Any]:
    loaded: dict[str, Any] = torch.load(io.BytesIO(data), weights_only=True)
    return loaded

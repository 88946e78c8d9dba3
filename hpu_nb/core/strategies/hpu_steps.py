"""What every HPU strategy adds to its Lightning base: device memory accounting and lazy-mode mark_step.

Written once as a mixin so the single-device, DDP, DeepSpeed and FSDP strategies do not each carry a copy
(lightning-habana duplicated this in every strategy).
"""

from __future__ import annotations

from typing import Any, Callable

from lightning.pytorch.plugins.io.checkpoint_plugin import CheckpointIO
from lightning.pytorch.plugins.io.wrapper import _WrappingCheckpointIO

from hpu_nb.core.checkpoint_io import HPUCheckpointIO
from hpu_nb.runtime import get_backend
from hpu_nb.runtime.base import iter_tensors


class HPUStepsMixin:
    """Put before a Lightning Strategy class in the bases: `class S(HPUStepsMixin, SingleDeviceStrategy)`."""

    # -- checkpoint IO defaults to HPUCheckpointIO -----------------------------------------------------------------
    @property
    def checkpoint_io(self) -> CheckpointIO:
        if self._checkpoint_io is None:
            self._checkpoint_io = HPUCheckpointIO()
        elif isinstance(self._checkpoint_io, _WrappingCheckpointIO) and self._checkpoint_io.checkpoint_io is None:
            self._checkpoint_io.checkpoint_io = HPUCheckpointIO()
        return self._checkpoint_io

    @checkpoint_io.setter
    def checkpoint_io(self, io: CheckpointIO | None) -> None:
        self._checkpoint_io = io

    # -- placing things on the device ------------------------------------------------------------------------------
    def model_to_device(self) -> None:
        super().model_to_device()  # type: ignore[misc]
        model = self.model  # type: ignore[attr-defined]
        backend = get_backend()
        backend.register_on_device(model.parameters())
        backend.register_on_device(model.buffers())

    def batch_to_device(self, batch: Any, device: Any = None, dataloader_idx: int = 0) -> Any:
        batch = super().batch_to_device(batch, device, dataloader_idx)  # type: ignore[misc]
        get_backend().register_on_device(iter_tensors(batch))
        return batch

    # -- training: everything computed runs on the device; lazy mode cuts the graph where Gaudi needs it -------------
    def backward(self, closure_loss: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        with get_backend().on_device():
            return super().backward(closure_loss, optimizer, *args, **kwargs)  # type: ignore[misc]

    def post_backward(self, closure_loss: Any) -> None:
        super().post_backward(closure_loss)  # type: ignore[misc]
        _mark_step_if_lazy()

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        with get_backend().on_device():
            output = super().optimizer_step(optimizer, closure, model, **kwargs)  # type: ignore[misc]
        _mark_step_if_lazy()
        return output

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        with get_backend().on_device():
            return super().training_step(*args, **kwargs)  # type: ignore[misc]

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        return _eval_step(super().validation_step, args, kwargs)  # type: ignore[misc]

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        return _eval_step(super().test_step, args, kwargs)  # type: ignore[misc]

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        return _eval_step(super().predict_step, args, kwargs)  # type: ignore[misc]


def _mark_step_if_lazy() -> None:
    backend = get_backend()
    if backend.is_lazy():
        backend.mark_step()


def _eval_step(step: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Evaluation steps get their own lazy graph: cut before and after."""
    _mark_step_if_lazy()
    with get_backend().on_device():
        output = step(*args, **kwargs)
    _mark_step_if_lazy()
    return output

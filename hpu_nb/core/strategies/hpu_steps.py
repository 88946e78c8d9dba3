"""What every HPU strategy adds to its Lightning base: mark_step where lazy mode needs it, HPUCheckpointIO by default,
and fp8 measurements written at the end of predict / test while the model is still on the device.

Written once as a mixin so the single-device, DDP, DeepSpeed and FSDP strategies do not each carry a copy
(lightning-habana duplicated this in every strategy). Device memory needs nothing here: the device counts it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lightning.pytorch.plugins.io.checkpoint_plugin import CheckpointIO
from lightning.pytorch.plugins.io.wrapper import _WrappingCheckpointIO
from typing_extensions import override

from hpu_nb.core.accelerator import HPUAccelerator, NotAnHPUError
from hpu_nb.core.checkpoint_io import HPUCheckpointIO
from hpu_nb.core.fp8.plugin import finish_run_measurements
from hpu_nb.runtime import get_backend

if TYPE_CHECKING:
    from hpu_nb.core.strategies.hosts import StrategyHost
else:
    StrategyHost = object  # a base for the type checker only (hosts.py)


class HPUAcceleratorOnly:
    """An HPU strategy refuses any other accelerator (Trainer and Fabric alike), when the connector hands it one."""

    _accelerator: Any

    @property
    @override
    def accelerator(self) -> Any:
        return self._accelerator

    @accelerator.setter
    @override
    def accelerator(self, accelerator: Any) -> None:
        if accelerator is not None and not isinstance(accelerator, HPUAccelerator):
            raise NotAnHPUError(
                f"{type(self).__name__} requires HPUAccelerator, got {type(accelerator).__name__}: use"
                " accelerator='hpu' (or HPUAccelerator()), or a strategy made for that accelerator."
            )
        self._accelerator = accelerator


class HPUCheckpointIODefault:
    """Checkpoint IO defaults to HPUCheckpointIO: for Trainer and Fabric strategies alike (one class serves both)."""

    _checkpoint_io: CheckpointIO | None

    @property
    @override
    def checkpoint_io(self) -> CheckpointIO:
        if self._checkpoint_io is None:
            self._checkpoint_io = HPUCheckpointIO()
        elif isinstance(self._checkpoint_io, _WrappingCheckpointIO) and self._checkpoint_io.checkpoint_io is None:
            self._checkpoint_io.checkpoint_io = HPUCheckpointIO()
        return self._checkpoint_io

    @checkpoint_io.setter
    @override
    def checkpoint_io(self, io: CheckpointIO | None) -> None:
        self._checkpoint_io = io


class HPUStepsMixin(HPUAcceleratorOnly, HPUCheckpointIODefault, StrategyHost):
    """Put before a Lightning (Trainer) Strategy class in the bases: `class S(HPUStepsMixin, SingleDeviceStrategy)`.

    Fabric's strategies have their own hooks for the same placement (hpu_nb.core.fabric.strategies).
    """

    # -- lazy mode cuts the graph where Gaudi needs it (a no-op in eager mode) --------------------------------------
    @override
    def post_backward(self, closure_loss: Any) -> None:
        super().post_backward(closure_loss)
        get_backend().mark_step()

    @override
    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        output = super().optimizer_step(optimizer, closure, model, **kwargs)
        get_backend().mark_step()
        return output

    # -- fp8 inference: measurements are written while the model is on the device (lightning-habana's timing) ---------
    @override
    def on_predict_end(self) -> None:
        _finish_fp8_measurements(self, "predict")
        super().on_predict_end()

    @override
    def on_test_end(self) -> None:
        _finish_fp8_measurements(self, "test")
        super().on_test_end()

    @override
    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        return _eval_step(super().validation_step, args, kwargs)

    @override
    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        return _eval_step(super().test_step, args, kwargs)

    @override
    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        return _eval_step(super().predict_step, args, kwargs)


def _finish_fp8_measurements(strategy: Any, stage: str) -> None:
    """Lightning's teardown moves the model to the CPU before the precision plugin's: write measurements before (and
    say there when the run measured nothing it was meant to)."""
    finish_run_measurements(strategy.precision_plugin, strategy.lightning_module, stage)


def _eval_step(step: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Evaluation steps get their own lazy graph: cut before and after."""
    backend = get_backend()
    backend.mark_step()
    output = step(*args, **kwargs)
    backend.mark_step()
    return output

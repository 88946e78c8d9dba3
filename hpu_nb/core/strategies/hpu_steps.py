"""What every HPU strategy of the Trainer adds to its Lightning base: mark_step where lazy mode needs it, the HPU guards
(an HPU accelerator, HPUCheckpointIO by default: hpu_nb.core.strategy_parts.guards, shared with Fabric), and fp8
measurements written at the end of predict / test while the model is still on the device.

Written once as a mixin so the single-device, DDP, DeepSpeed and FSDP strategies do not each carry a copy
(lightning-habana duplicated this in every strategy). Device memory needs nothing here: the device counts it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from hpu_nb.core.fp8.plugin import finish_run_measurements
from hpu_nb.core.strategy_parts.guards import HPUAcceleratorOnly, HPUCheckpointIODefault
from hpu_nb.runtime import get_backend

if TYPE_CHECKING:
    from lightning.pytorch.strategies.strategy import Strategy as StrategyHost
else:
    StrategyHost = object  # a base for the type checker only: the Lightning (Trainer) Strategy it is mixed into

__all__ = ["HPUAcceleratorOnly", "HPUCheckpointIODefault", "HPUStepsMixin"]  # the guards: hpu_nb.core.strategy_parts


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

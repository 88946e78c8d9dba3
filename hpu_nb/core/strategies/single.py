"""SingleHPUStrategy: one Gaudi card (or one emulated card), as Lightning's SingleDeviceStrategy."""

from __future__ import annotations

from typing import Any

from lightning.fabric.utilities.types import _DEVICE
from lightning.pytorch.strategies.single_device import SingleDeviceStrategy
from typing_extensions import override

from hpu_nb.core.strategies.hpu_steps import HPUStepsMixin
from hpu_nb.runtime import get_backend

__all__ = ["SingleHPUStrategy"]


class SingleHPUStrategy(HPUStepsMixin, SingleDeviceStrategy):
    """Train on one HPU: model on the device, mark_step in lazy mode, HPUCheckpointIO by default."""

    strategy_name = "hpu_single"

    def __init__(
        self,
        device: _DEVICE | None = None,
        accelerator: Any = None,
        checkpoint_io: Any = None,
        precision_plugin: Any = None,
    ) -> None:
        # "hpu" (what Gaudi users write) means this process's card, hpu:0.
        if device is None or str(device) == "hpu":
            device = get_backend().root_device()
        super().__init__(device=device, accelerator=accelerator, checkpoint_io=checkpoint_io,
                         precision_plugin=precision_plugin)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(cls.strategy_name, cls, description=cls.__name__, override=True)

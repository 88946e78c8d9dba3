"""What every HPU strategy, the Trainer's and Fabric's alike, holds to: an HPU accelerator only, and HPUCheckpointIO
unless another checkpoint IO is given. One class each serves both Lightning trees (the attributes they guard are the
same)."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.plugins.io.checkpoint_plugin import CheckpointIO
from lightning.pytorch.plugins.io.wrapper import _WrappingCheckpointIO
from typing_extensions import override

from hpu_nb.core.accelerator import HPUAccelerator, NotAnHPUError
from hpu_nb.core.checkpoint_io import HPUCheckpointIO

__all__ = ["HPUAcceleratorOnly", "HPUCheckpointIODefault"]


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

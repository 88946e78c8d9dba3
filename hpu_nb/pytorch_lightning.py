"""hpu_nb's Trainer pieces for the standalone `pytorch_lightning` package: `from hpu_nb.pytorch_lightning import ...`.

`pl.Trainer(accelerator="hpu")` needs nothing from here (the names are registered with pytorch_lightning when it is
imported); these classes are for the instance forms, e.g. `pl.Trainer(accelerator=HPUAccelerator(),
strategy=HPUDDPStrategy(start_method="spawn"))`. They are hpu_nb.core, translated (hpu_nb/wiring/flavours.py): the
same code as `hpu_nb.HPUAccelerator` & co., built on pytorch_lightning's classes instead of lightning.pytorch's.
"""

from __future__ import annotations

from typing import Any

from hpu_nb.wiring import flavours

# public name -> module under hpu_nb.core
_EXPORTS = {
    "HPUAccelerator": "accelerator",
    "SingleHPUStrategy": "strategies.single",
    "HPUParallelStrategy": "strategies.parallel",
    "HPUDDPStrategy": "strategies.parallel",
    "HPUDeepSpeedStrategy": "strategies.deepspeed",
    "HPUDeepSpeedPrecisionPlugin": "strategies.deepspeed",
    "HPUFSDPStrategy": "strategies.fsdp",
    "HPUFSDPPrecision": "strategies.fsdp",
    "HPUPrecisionPlugin": "precision",
    "HPUCheckpointIO": "checkpoint_io",
    "HPUProfiler": "profiler",
    "HPUGraphMetrics": "metrics",
    "HPUDataModule": "datamodule",
}
FLAVOUR = "standalone"
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(flavours.core_module(FLAVOUR, _EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))

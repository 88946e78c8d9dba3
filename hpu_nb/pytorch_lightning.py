"""hpu_nb's Trainer pieces for the standalone `pytorch_lightning` package: `from hpu_nb.pytorch_lightning import ...`.

`pl.Trainer(accelerator="hpu")` needs nothing from here (the names are registered with pytorch_lightning when it is
imported); these classes are for the instance forms, e.g. `pl.Trainer(accelerator=HPUAccelerator(),
strategy=HPUDDPStrategy(start_method="spawn"))`. They are hpu_nb.core, translated (hpu_nb/wiring/flavours.py): the
same code as `hpu_nb.HPUAccelerator` & co., built on pytorch_lightning's classes instead of lightning.pytorch's.
"""

from __future__ import annotations

from typing import Any

from hpu_nb.wiring import flavours

# public name -> module under hpu_nb
_EXPORTS = {
    "HPUAccelerator": "core.accelerator",
    "SingleHPUStrategy": "core.strategies.single",
    "HPUParallelStrategy": "core.strategies.parallel",
    "HPUDDPStrategy": "core.strategies.parallel",
    "HPUDeepSpeedStrategy": "core.strategies.deepspeed",
    "HPUDeepSpeedPrecisionPlugin": "core.strategies.deepspeed",
    "HPUFSDPStrategy": "core.strategies.fsdp",
    "HPUFSDPPrecision": "core.strategies.fsdp",
    "HPUPrecisionPlugin": "core.precision",
    "HPUCheckpointIO": "core.checkpoint_io",
    "HPUProfiler": "core.profiler",
    "HPUGraphMetrics": "core.metrics",
    "HPUDataModule": "core.datamodule",
    "MemoryMonitor": "notebook.memory_monitor",  # the live chart, a Lightning Callback (IPython needed)
}
FLAVOUR = "standalone"
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(flavours.flavour_module(FLAVOUR, _EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))

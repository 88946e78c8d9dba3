"""hpu_nb: train with PyTorch Lightning on Intel Gaudi (HPU) from a notebook — or on an emulated Gaudi anywhere.

Importing this package is cheap: it imports neither torch nor Lightning, touches no device and starts no
subprocess. Public names load on first use; Lightning (`lightning` and the standalone `pytorch_lightning` /
`lightning_fabric`, Trainer and Fabric) learns about "hpu" when it is imported; where Habana's software is not
installed, `habana_frameworks` and `torch.hpu` resolve to the emulated Gaudi when first imported.

Names here are for `lightning` (`lightning.pytorch`, and Fabric's `HPUPrecision`); `hpu_nb.fabric` has every Fabric
name, `hpu_nb.pytorch_lightning` / `hpu_nb.lightning_fabric` the same pieces for the standalone packages.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "HPUAccelerator": "hpu_nb.core.accelerator",
    "is_fp8_available": "hpu_nb.core.accelerator",
    "is_fp16_available": "hpu_nb.core.accelerator",
    "SingleHPUStrategy": "hpu_nb.core.strategies.single",
    "HPUParallelStrategy": "hpu_nb.core.strategies.parallel",
    "HPUDDPStrategy": "hpu_nb.core.strategies.parallel",
    "HPUDeepSpeedStrategy": "hpu_nb.core.strategies.deepspeed",
    "HPUDeepSpeedPrecisionPlugin": "hpu_nb.core.strategies.deepspeed",
    "HPUFSDPStrategy": "hpu_nb.core.strategies.fsdp",
    "HPUFSDPPrecision": "hpu_nb.core.strategies.fsdp",
    "HPUPrecisionPlugin": "hpu_nb.core.precision",
    "HPUGradScaler": "hpu_nb.core.mixed_precision",
    "hpu_autocast": "hpu_nb.core.precision",
    "autocast_device_type": "hpu_nb.core.precision",
    "DelayedScaling": "hpu_nb.core.fp8",
    "Format": "hpu_nb.core.fp8",
    "HPUCheckpointIO": "hpu_nb.core.checkpoint_io",
    "InvalidCheckpointError": "hpu_nb.core.checkpoint_io",
    "HPUDataModule": "hpu_nb.core.datamodule",
    "StuckRankError": "hpu_nb.core.strategy_parts.liveness",
    "HPUPrecision": "hpu_nb.core.fabric.precision",
    "HPUGraphMetrics": "hpu_nb.core.metrics",
    "HPUProfiler": "hpu_nb.core.profiler",
    "TrainerConfig": "hpu_nb.notebook.trainer_config",
    "MemoryMonitor": "hpu_nb.notebook.memory_monitor",
    "TrainerConfigWidget": "hpu_nb.notebook.config_widget",
    "PrecisionConfigWidget": "hpu_nb.notebook.config_widget",
    "TraceViewer": "hpu_nb.notebook.trace_viewer",
    "is_out_of_memory": "hpu_nb.runtime",
    "HPUNotAvailableError": "hpu_nb.runtime",
    "get_backend": "hpu_nb.runtime",
    "plan_batch_sizes": "hpu_nb.plan",
    "Plan": "hpu_nb.plan",
}
# `hpu_nb.plan` is the planning package, callable as its plan() function: hpu_nb.plan(model, batch, ...) and
# hpu_nb.plan.with_generation / hpu_nb.plan.PlanError alike.
_SUBPACKAGES = ("runtime", "core", "traces", "notebook", "fabric", "pytorch_lightning", "lightning_fabric", "plan")

__all__ = sorted([*_EXPORTS, "plan"]) + ["load_ipython_extension", "unload_ipython_extension"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f"hpu_nb.{name}")
    raise AttributeError(f"module 'hpu_nb' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | set(_SUBPACKAGES))


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext hpu_nb`."""
    from hpu_nb.notebook.extension import load_ipython_extension as load  # noqa: PLC0415 -- lazy: IPython, torch

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """`%unload_ext hpu_nb`."""
    from hpu_nb.notebook.extension import unload_ipython_extension as unload  # noqa: PLC0415 -- lazy: IPython

    unload(ipython)


def _open_trace_viewer(path: str, **options: Any) -> Any:
    """HPUProfiler.show()'s viewer: the notebook layer's TraceViewer, imported on first use; None where it cannot
    load (show() then gives the trace's text summary)."""
    try:
        from hpu_nb.notebook.trace_viewer import TraceViewer  # noqa: PLC0415 -- lazy: IPython, anywidget
    except ImportError:
        return None
    return TraceViewer(path, **options)


from hpu_nb.emulator import habana as _emulated_habana  # noqa: E402
from hpu_nb.wiring import flavours as _flavours  # noqa: E402
from hpu_nb.wiring import lightning_registration as _lightning_registration  # noqa: E402
from hpu_nb.wiring import viewer_slot as _viewer_slot  # noqa: E402

_flavours.install()  # hpu_nb._standalone: hpu_nb.core for the standalone pytorch_lightning / lightning_fabric
_lightning_registration.install()
_emulated_habana.install()  # `habana_frameworks` / `torch.hpu` resolve to the emulated Gaudi where Habana's is absent
if _viewer_slot.registered_trace_viewer() is None:  # HPUProfiler.show() in a notebook, without %load_ext
    _viewer_slot.register_trace_viewer(_open_trace_viewer)

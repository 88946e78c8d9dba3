"""fp8 on HPU: training layers with delayed scaling, and inference by measure-then-quantize.

The Lightning-facing side (convert_modules, configs and files, when measurements are written); the fp8 work itself is
the device's fp8 engine (hpu_nb.runtime.fp8). Training goes through Habana's transformer engine on both backends (the
emulated one on the emulated Gaudi2/3, whose te.Linear is an Fp8Linear); inference through Intel Neural Compressor on
a Gaudi, the emulation's measure / quantize elsewhere.

The layers convert_modules produces are the backend's (Habana's te.Linear / INC's modules on a Gaudi, the emulator's
on the emulated Gaudi): this package names none of them; `has_fp8_layers` tells whether a model has them, on both.
"""

from __future__ import annotations

from hpu_nb.core.fp8.convert import (
    convert_modules,
    fp8_autocast,
    has_fp8_layers,
    replace_linear_layers,
    require_fp8,
    to_te_recipe,
)
from hpu_nb.core.fp8.inference import (
    Fp8InferenceError,
    InferencePlan,
    apply_inference,
    finalize_measurements,
    make_config,
    normalize_config,
    pending_measurements,
    plan_inference,
    state_of,
)
from hpu_nb.runtime.fp8.recipe import DelayedScaling, Format

__all__ = [
    "DelayedScaling",
    "Format",
    "Fp8InferenceError",
    "InferencePlan",
    "apply_inference",
    "convert_modules",
    "finalize_measurements",
    "fp8_autocast",
    "has_fp8_layers",
    "make_config",
    "normalize_config",
    "pending_measurements",
    "plan_inference",
    "replace_linear_layers",
    "require_fp8",
    "state_of",
    "to_te_recipe",
]

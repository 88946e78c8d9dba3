"""fp8 on HPU: training layers with delayed scaling, and inference by measure-then-quantize.

The Lightning-facing side (convert_modules, configs and files, when measurements are written); the fp8 work itself is
the device's fp8 engine (hpu_nb.runtime.fp8). Training goes through Habana's transformer engine on both backends (the
emulated one on the emulated Gaudi2/3, whose te.Linear is an Fp8Linear); inference through Intel Neural Compressor on
a Gaudi, the emulation's measure / quantize elsewhere.
"""

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
from hpu_nb.emulator.fp8.engine import Fp8QuantLinear
from hpu_nb.emulator.fp8.numerics import matmul_path
from hpu_nb.emulator.fp8.training import Fp8Linear, emulated_fp8_autocast, fp8_enabled
from hpu_nb.runtime.fp8.recipe import DelayedScaling, Format

__all__ = [
    "DelayedScaling",
    "Format",
    "Fp8InferenceError",
    "Fp8Linear",
    "Fp8QuantLinear",
    "InferencePlan",
    "apply_inference",
    "convert_modules",
    "emulated_fp8_autocast",
    "finalize_measurements",
    "fp8_autocast",
    "fp8_enabled",
    "has_fp8_layers",
    "make_config",
    "matmul_path",
    "normalize_config",
    "pending_measurements",
    "plan_inference",
    "replace_linear_layers",
    "require_fp8",
    "state_of",
    "to_te_recipe",
]

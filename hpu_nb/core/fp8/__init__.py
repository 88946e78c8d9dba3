"""fp8 on HPU: training layers with delayed scaling, and inference by measure-then-quantize.

On a Gaudi these delegate to Habana's transformer engine and Intel Neural Compressor / HQT (hpu_nb.runtime.habana_fp8);
on the emulated Gaudi2/3 they are real fp8 numerics on the CPU (float8 casts and torch._scaled_mm).
"""

from hpu_nb.core.fp8.convert import convert_modules, fp8_autocast, replace_linear_layers, require_fp8, to_te_recipe
from hpu_nb.core.fp8.inference import (
    Fp8InferenceError,
    Fp8QuantLinear,
    finalize_measurements,
    make_config,
    state_of,
)
from hpu_nb.core.fp8.linear import Fp8Linear, emulated_fp8_autocast, fp8_enabled
from hpu_nb.core.fp8.numerics import matmul_path
from hpu_nb.core.fp8.recipe import DelayedScaling, Format

__all__ = [
    "DelayedScaling",
    "Format",
    "Fp8InferenceError",
    "Fp8Linear",
    "Fp8QuantLinear",
    "convert_modules",
    "emulated_fp8_autocast",
    "finalize_measurements",
    "fp8_autocast",
    "fp8_enabled",
    "make_config",
    "matmul_path",
    "replace_linear_layers",
    "require_fp8",
    "state_of",
    "to_te_recipe",
]

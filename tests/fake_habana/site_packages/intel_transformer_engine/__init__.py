"""Fake Intel transformer engine (`intel_transformer_engine`): Linear, fp8_autocast, recipe, fp8.

Since Gaudi software 1.19 Habana's `habana_frameworks.torch.hpex.experimental.transformer_engine` is a shim that
re-exports this package, so the classes' `__module__` starts with "intel_transformer_engine".
fp8 is simulated on the CPU: inside fp8_autocast a te.Linear rounds its input and weight through
float8 (E4M3 forward, per-tensor max-abs scaling) and returns the activation dtype (autocast's where autocast is on,
else the input's), as the transformer engine's Linear does (lightning-habana's Gaudi 2 tests assert float32 outputs
and gradients without autocast).
"""

import contextlib

import torch
from habana_frameworks._fake import STATE as _STATE
from habana_frameworks._fake import recorded as _recorded

from intel_transformer_engine import fp8, recipe  # noqa: F401
from intel_transformer_engine.fp8 import FP8GlobalStateManager

# The full scale of each format by device: Gaudi2's E4M3 range is +-240 (the fnuz variant, as INC's get_fullscale and
# the bridge's quantizer have it), Gaudi3's +-448; E5M2's 57344 on both.
_FP8_MAX = {"GAUDI2": {"E4M3": 240.0, "E5M2": 57344.0}, "GAUDI3": {"E4M3": 448.0, "E5M2": 57344.0}}


def _through_fp8(x, fmt):
    dtype = torch.float8_e4m3fn if fmt == "E4M3" else torch.float8_e5m2
    amax = (x.detach().abs().max() if x.numel() else x.new_zeros(())).float().clamp(min=1e-12)
    scale = _FP8_MAX[_STATE.config.device_name.upper()][fmt] / amax
    return (x.float() * scale).to(dtype).float() / scale


class Linear(torch.nn.Linear):
    """Like torch.nn.Linear; under fp8_autocast its matmul sees fp8-rounded operands and it returns the activation
    dtype."""

    @_recorded
    def __init__(self, in_features, out_features, bias=True, **kwargs):
        super().__init__(in_features, out_features, bias=bias)

    def forward(self, x):
        if not FP8GlobalStateManager.is_fp8_enabled():
            return super().forward(x)
        fmt = "E4M3"  # HYBRID: E4M3 in the forward pass, E5M2 for gradients
        rec = FP8GlobalStateManager.get_fp8_recipe()
        if rec is not None and rec.fp8_format == recipe.Format.E5M2:
            fmt = "E5M2"
        device = x.device.type
        activation = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        with torch.autocast(device, enabled=False):
            out = torch.nn.functional.linear(_through_fp8(x, fmt), _through_fp8(self.weight, fmt), self.bias)
        return out.to(activation)


@_recorded
@contextlib.contextmanager
def fp8_autocast(enabled=True, fp8_recipe=None, **kwargs):
    if enabled and _STATE.config.device_name.upper() == "GAUDI":
        raise RuntimeError("FP8 is not supported on GAUDI (first generation): fp8 needs Gaudi2 or newer")
    previous = FP8GlobalStateManager._enter(enabled, fp8_recipe or recipe.DelayedScaling())
    try:
        yield
    finally:
        FP8GlobalStateManager._exit(previous)

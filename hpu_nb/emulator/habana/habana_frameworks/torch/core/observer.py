"""habana_frameworks.torch.core.observer, emulated: Habana's fp8 observers for PT2E quantization.

`AbsMaxObserver` (running min / max) and `SimpleAbsMaxObserver` (running absolute max) record statistics during
calibration and give per-tensor symmetric fp8 parameters: zero point 0, scale = max(absmax * 2**backoff_margin /
half-range, eps) rounded up to a scale the fp8 hardware applies - a power of two, then (as Habana's 1.19 computes it,
with Gaudi2's exponent biases whatever the card) a power of 2**4 between 2**-8 and 2**4 for float8_e4m3fn, and 1 for
float8_e5m2. Signatures, checks and messages are Habana's (gaudi-pytorch-bridge 1.19); the maths runs on the tensors'
device (the emulated `hpu` computes on the CPU).

Their base class is the observer base of the PT2E quantization API present: torch's own (`torch.ao.quantization`)
while torch still ships the PT2E quantizer, else torchao's (`torchao.quantization.pt2e`) where torchao is installed,
else torch's observer base, so that the observers can still be used on their own.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from typing import Any

import torch

__all__ = ["AbsMaxObserver", "SimpleAbsMaxObserver"]
__emulated__ = True

logger = logging.getLogger("habana_frameworks.torch.core.observer")  # Habana's: "PT2E-QUANT CUSTOM HABANA OBSERVERS"

_PT2E_APIS = (  # (quantizer module, observer module): torch's own first, then torchao's
    ("torch.ao.quantization.quantizer", "torch.ao.quantization.observer"),
    ("torchao.quantization.pt2e.quantizer", "torchao.quantization.pt2e.observer"),
)


def _find(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a parent package is missing (no torchao)
        return False


def pt2e_api() -> tuple[str, str] | None:
    """(quantizer module, observer module) of the PT2E quantization API installed, or None when there is none."""
    for quantizer, observer in _PT2E_APIS:
        if _find(quantizer):
            return quantizer, observer
    return None


_api = pt2e_api()
_observer_module = importlib.import_module(_api[1] if _api else "torch.ao.quantization.observer")
_ObserverBase: Any = _observer_module.UniformQuantizationObserverBase

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_EXPONENT_WIDTH = {torch.float8_e4m3fn: 4, torch.float8_e5m2: 5}
_GAUDI2_EXPONENT_BIASES = {torch.float8_e4m3fn: (3, 7, 11, 15), torch.float8_e5m2: (15,)}
_GAUDI2_SCALE_STEP = 4  # Gaudi2 applies scales that are powers of 2**4 (Gaudi3: any power of two)


def _scale_to_pow2_hw(scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The hardware-aligned scale: a power of two, then a power of 2**4 within the scales Gaudi2's exponent biases
    give (2**(default bias - bias)), as Habana's observers compute it (Gaudi2's table for every card)."""
    default_bias = 2 ** (_EXPONENT_WIDTH[dtype] - 1) - 1
    scales = [2.0 ** (default_bias - bias) for bias in _GAUDI2_EXPONENT_BIASES[dtype]]
    pow2 = 2 ** torch.ceil(torch.log2(scale))
    aligned = 2 ** (torch.ceil(torch.log2(pow2) / _GAUDI2_SCALE_STEP) * _GAUDI2_SCALE_STEP)
    low = torch.tensor(min(scales), dtype=scale.dtype, device=scale.device)
    high = torch.tensor(max(scales), dtype=scale.dtype, device=scale.device)
    return torch.minimum(torch.maximum(aligned, low), high)


def _check(name: str, dtype: torch.dtype, qscheme: Any, reduce_range: Any, is_dynamic: Any) -> None:
    if dtype not in _FP8:
        raise NotImplementedError(f"{name}: dtype only supports torch.float8_e5m2 and torch.float8_e4m3fn.")
    if qscheme != torch.per_tensor_symmetric:
        raise NotImplementedError(f"{name}: qscheme only supports torch.per_tensor_symmetric.")
    if reduce_range is not False:
        raise NotImplementedError(f"{name}: reduce_range is not supported.")
    if is_dynamic is not False:
        raise NotImplementedError(f"{name}: is_dynamic is not supported.")


class _Fp8Observer(_ObserverBase):  # type: ignore[misc]
    """What both observers share: Habana's signature and checks, and the zero point and hardware-aligned scale their
    statistics give. Each registers its own statistic buffers (`_register_statistics`)."""

    def __init__(self, dtype: torch.dtype = torch.float8_e4m3fn, qscheme: Any = torch.per_tensor_symmetric,
                 reduce_range: bool = False, quant_min: float = torch.finfo(torch.float8_e4m3fn).min,
                 quant_max: float = torch.finfo(torch.float8_e4m3fn).max, factory_kwargs: Any = None,
                 eps: float = torch.finfo(torch.float32).eps, backoff_margin: float = 0, is_dynamic: bool = False,
                 **kwargs: Any) -> None:
        _check(type(self).__name__, dtype, qscheme, reduce_range, is_dynamic)
        assert quant_min == -quant_max
        super().__init__(dtype=dtype, qscheme=qscheme, reduce_range=reduce_range, quant_min=quant_min,
                         quant_max=quant_max, factory_kwargs=factory_kwargs, eps=eps, is_dynamic=is_dynamic, **kwargs)
        self._register_statistics(torch.nn.factory_kwargs(factory_kwargs))
        self.backoff_margin = backoff_margin

    def _register_statistics(self, factory_kwargs: dict[str, Any]) -> None:
        raise NotImplementedError

    def _qparams(self, scale: torch.Tensor, statistic: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """scale * 2**backoff_margin, at least eps, aligned for fp8; zero point 0, on the statistic's device."""
        adjusted = torch.max(scale * (2 ** self.backoff_margin), self.eps)
        if self.dtype in _FP8:
            adjusted = _scale_to_pow2_hw(adjusted, self.dtype)
        logger.debug("old_scale = %s, new_scale = %s", scale.item(), adjusted.item())
        return adjusted, torch.zeros(statistic.size(), dtype=torch.int64, device=statistic.device.type)


class AbsMaxObserver(_Fp8Observer):
    """Running min / max of what it sees; scale = max(max(-min, max) * 2**backoff_margin / ((quant_max - quant_min)
    / 2), eps), hardware-aligned; zero point 0."""

    min_val: torch.Tensor
    max_val: torch.Tensor

    def _register_statistics(self, factory_kwargs: dict[str, Any]) -> None:
        self.register_buffer("min_val", torch.tensor(float("inf"), **factory_kwargs))
        self.register_buffer("max_val", torch.tensor(float("-inf"), **factory_kwargs))

    def forward(self, x_orig: torch.Tensor) -> torch.Tensor:
        """Records the running minimum and maximum of `x_orig` and returns it unchanged."""
        if x_orig.numel() == 0:
            return x_orig
        low, high = torch.aminmax(x_orig.detach().to(self.min_val.dtype))
        self.min_val.copy_(torch.min(low, self.min_val))
        self.max_val.copy_(torch.max(high, self.max_val))
        return x_orig

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        absmax = torch.max(-torch.clamp(self.min_val, max=0), torch.clamp(self.max_val, min=0))
        return self._qparams(absmax / (float(self.quant_max - self.quant_min) / 2), self.max_val)

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}"

    def reset_observer_state(self) -> None:
        """Resets the min / max values."""
        self.min_val.copy_(torch.tensor(float("inf")))
        self.max_val.copy_(torch.tensor(float("-inf")))


class SimpleAbsMaxObserver(_Fp8Observer):
    """Running absolute max of what it sees; scale = max(absmax * 2**backoff_margin / quant_max, eps),
    hardware-aligned; zero point 0."""

    abs_max_val: torch.Tensor

    def _register_statistics(self, factory_kwargs: dict[str, Any]) -> None:
        self.register_buffer("abs_max_val", torch.tensor(float("-inf"), **factory_kwargs))

    def forward(self, x_orig: torch.Tensor) -> torch.Tensor:
        """Records the running absolute maximum of `x_orig` and returns it unchanged."""
        if x_orig.numel() == 0:
            return x_orig
        current = torch.amax(torch.abs(x_orig.detach().to(self.abs_max_val.dtype)))
        self.abs_max_val.copy_(torch.max(current, self.abs_max_val))
        return x_orig

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._qparams(self.abs_max_val / float(self.quant_max), self.abs_max_val)

    def extra_repr(self) -> str:
        return f"abs_max_val={self.abs_max_val}"

    def reset_observer_state(self) -> None:
        """Resets the absolute max value."""
        self.abs_max_val.copy_(torch.tensor(float("-inf")))

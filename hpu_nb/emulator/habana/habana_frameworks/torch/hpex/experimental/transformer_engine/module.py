"""transformer_engine.Linear, emulated: Habana's fp8 linear layer on the emulated Gaudi.

Constructor as Habana's (`te.Linear(in_features, out_features, bias=True, params_dtype=None, device=None,
skip_weight_param_allocation=False, minimize_memory=False, init_method=None, return_bias=False)`): with
skip_weight_param_allocation the layer has no weight or bias of its own (assign them, as optimum-habana does, or pass
them to forward). Inside an enabled te.fp8_autocast it computes in fp8 with the region's recipe and returns
bfloat16; outside, it is a plain linear layer. It is an hpu_nb Fp8Linear (the emulation's fp8 layer).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from hpu_nb.emulator.fp8.training import Fp8Linear

__emulated__ = True
__all__ = ["Linear"]


class Linear(Fp8Linear):
    """y = x W^T + b, in fp8 inside te.fp8_autocast(enabled=True)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        params_dtype: torch.dtype | None = None,
        device: Any = None,
        skip_weight_param_allocation: bool = False,
        minimize_memory: bool = False,
        init_method: Callable[[torch.Tensor], Any] | None = None,
        return_bias: bool = False,
    ) -> None:
        torch.nn.Module.__init__(self)
        if in_features <= 0 or out_features <= 0:
            raise ValueError(f"te.Linear needs positive sizes, got in_features={in_features},"
                             f" out_features={out_features}.")
        self.use_bias, self.return_bias, self.minimize_memory = bool(bias), bool(return_bias), bool(minimize_memory)
        self.params_dtype = params_dtype or torch.get_default_dtype()
        weight = bias_param = None
        if not skip_weight_param_allocation:
            weight = torch.nn.Parameter(torch.empty(out_features, in_features, dtype=self.params_dtype,
                                                    device=device))
            with torch.no_grad():
                if init_method is not None:
                    init_method(weight)
                else:  # as nn.Linear initialises
                    torch.nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
            if bias:
                bias_param = torch.nn.Parameter(torch.zeros(out_features, dtype=self.params_dtype, device=device))
        self._setup(in_features, out_features, weight, bias_param, None, device)

    def forward(  # type: ignore[override]
        self, inp: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
        is_first_microbatch: bool | None = None,
    ) -> Any:
        """`weight` / `bias` are required when the layer was built with skip_weight_param_allocation and none was
        assigned. With return_bias=True the bias is returned, not added: (output, bias)."""
        weight = weight if weight is not None else self.weight
        if weight is None:
            raise RuntimeError("te.Linear was built with skip_weight_param_allocation=True: pass weight= to forward()"
                               " or assign layer.weight.")
        bias = bias if bias is not None else self.bias
        if self.return_bias:
            return self._linear(inp, weight, None), bias
        return self._linear(inp, weight, bias)

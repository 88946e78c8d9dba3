"""The emulated fp8 linear layer (what te.Linear is on a Gaudi) and the fp8_autocast switch for it.

Inside `fp8_autocast(enabled=True)`, Fp8Linear quantises its input and weight to the recipe's forward format
(E4M3 for HYBRID) and the incoming gradient to the backward format (E5M2 for HYBRID), each with a per-tensor
scale from an amax history (delayed scaling: this step uses the scale earlier steps chose), multiplies with
torch._scaled_mm and returns bfloat16 like Habana's fp8 modules. Outside it, it is a plain nn.Linear.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, Optional

import torch
import torch.nn.functional as F

from hpu_nb.core.fp8.numerics import amax, quantize, scale_from_amax, scaled_mm
from hpu_nb.core.fp8.recipe import DelayedScaling, as_recipe

OUT_DTYPE = torch.bfloat16
INPUT, WEIGHT, GRAD = 0, 1, 2

_state = threading.local()


def fp8_enabled() -> bool:
    return getattr(_state, "enabled", False)


def active_recipe() -> Optional[DelayedScaling]:
    return getattr(_state, "recipe", None)


@contextlib.contextmanager
def emulated_fp8_autocast(enabled: bool = True, recipe: Any = None) -> Iterator[None]:
    """Turn the emulated fp8 layers on (or off) inside the block; nests like te.fp8_autocast."""
    previous = (fp8_enabled(), active_recipe())
    _state.enabled, _state.recipe = bool(enabled), (as_recipe(recipe) if recipe is not None else previous[1])
    try:
        yield
    finally:
        _state.enabled, _state.recipe = previous


class _Fp8Matmul(torch.autograd.Function):
    """y = x W^T + b with fp8 operands; the backward pass quantises the gradient too (it is where E5M2 is used)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], layer: "Fp8Linear") -> torch.Tensor:
        recipe = layer.recipe
        fwd = recipe.fp8_format.forward_dtype
        x2 = x.reshape(-1, x.shape[-1])
        sx, sw = layer.scale[INPUT].clone(), layer.scale[WEIGHT].clone()
        xq, wq = quantize(x2, sx, fwd), quantize(weight, sw, fwd)
        if layer.training:
            layer._record(INPUT, amax(x2))
            layer._record(WEIGHT, amax(weight))
        out = scaled_mm(xq, wq.t(), sx, sw, out_dtype=torch.float32)
        if bias is not None:
            out = out + bias.float()
        ctx.save_for_backward(xq, wq, sx, sw)
        ctx.layer, ctx.x_shape, ctx.x_dtype, ctx.has_bias = layer, x.shape, x.dtype, bias is not None
        return out.to(OUT_DTYPE).reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple:
        xq, wq, sx, sw = ctx.saved_tensors
        layer: Fp8Linear = ctx.layer
        bwd = layer.recipe.fp8_format.backward_dtype
        g2 = grad_out.reshape(-1, grad_out.shape[-1])
        sg = layer.scale[GRAD].clone()
        layer._record(GRAD, amax(g2))
        gq = quantize(g2, sg, bwd)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = scaled_mm(gq, wq, sg, sw, out_dtype=torch.float32).to(ctx.x_dtype).reshape(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            grad_w = scaled_mm(gq.t(), xq, sg, sx, out_dtype=torch.float32).to(layer.weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g2.float().sum(0).to(layer.bias.dtype)
        return grad_x, grad_w, grad_b, None


class Fp8Linear(torch.nn.Module):
    """nn.Linear with emulated fp8 matmuls under fp8_autocast; keeps the original layer's parameters."""

    def __init__(self, linear: torch.nn.Linear, recipe: Any = None) -> None:
        super().__init__()
        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(f"Fp8Linear wraps an nn.Linear, got {type(linear).__name__}.")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # the same Parameter: trained values kept, optimizers still see it
        self.bias = linear.bias
        self.recipe = as_recipe(recipe)
        device = linear.weight.device
        self.register_buffer("amax_history", torch.zeros(self.recipe.amax_history_len, 3, device=device))
        self.register_buffer("scale", torch.ones(3, device=device))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long, device=device))
        self._pending = torch.zeros(3, device=device)  # this step's amaxes, folded into the history on the next one

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, recipe: Any = None) -> "Fp8Linear":
        return cls(linear, recipe)

    def _record(self, which: int, value: torch.Tensor) -> None:
        self._pending[which] = torch.maximum(self._pending[which], value)

    def _roll_history(self) -> None:
        """Delayed scaling: fold the last step's amaxes into the history, and every `interval` steps rescale."""
        if not bool(self._pending.any()):
            return
        self.amax_history.copy_(torch.roll(self.amax_history, 1, dims=0))
        self.amax_history[0] = self._pending
        self._pending = torch.zeros_like(self._pending)
        self.steps += 1
        if int(self.steps) % self.recipe.interval == 0:
            if self.recipe.amax_compute_algo == "max":
                current = self.amax_history.amax(dim=0)
            else:
                current = self.amax_history[0]
            fmt = self.recipe.fp8_format
            dtypes = (fmt.forward_dtype, fmt.forward_dtype, fmt.backward_dtype)
            new = torch.stack([scale_from_amax(current[i], dtypes[i], self.recipe.margin) for i in range(3)])
            self.scale.copy_(torch.where(current > 0, new, self.scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not fp8_enabled():
            return F.linear(x, self.weight, self.bias)
        if self.training:
            self._roll_history()
        return _Fp8Matmul.apply(x, self.weight, self.bias, self)

    def extra_repr(self) -> str:
        r = self.recipe
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"fp8_format={r.fp8_format.name}, amax_history_len={r.amax_history_len}, margin={r.margin}"
        )

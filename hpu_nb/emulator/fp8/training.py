"""fp8 training on the emulated Gaudi: the fp8 state (what te.fp8_autocast turns on) and the fp8 linear layer.

The emulated `habana_frameworks.torch.hpex.experimental.transformer_engine` is built on this module: its
`fp8_autocast` / `FP8GlobalStateManager` are `Fp8State` here, its `Linear` is an `Fp8Linear`. Inside an enabled
fp8 region, Fp8Linear quantises its input and weight to the recipe's forward format (E4M3 for HYBRID) and the incoming
gradient to the backward format (E5M2 for HYBRID), each with a per-tensor scale from an amax history (delayed scaling:
this step uses the scale earlier steps chose), multiplies with float32 accumulation and returns the activation dtype
(`activation_dtype`: autocast's where autocast is on, else the input's), as the transformer engine's Linear does. The
fp8 values are held in float32 (numerics.round_to_fp8_grid: the same values as float8 casts, fast on a CPU; one C++ pass
with the amax where the emulated device's library has it), so the saved activations take 4 bytes a value where a Gaudi
keeps 1; large work tensors are reused from step to step. Outside fp8 it is a plain linear.

On fake tensors (hpu_nb.plan traces the step under FakeTensorMode) there are no values: no amax is taken, no scale is
read to the host and the delayed-scaling history is not rolled; the layer allocates, op for op, what the layout of
`Fp8State.traced_layout` holds: "gaudi" (the default: a plan for a Gaudi counts a Gaudi's bytes) models Habana's
transformer engine (an adaptation of NVIDIA TE 1.x's Linear: cast_to_fp8 writes 1-byte fp8 copies of the input, the
weight and the incoming gradient, the fp8 GEMM writes the output in the activation dtype, dgrad in the input's dtype and
wgrad in the weight's directly); "emulated" allocates what this module's eager path does (float32 fp8-valued copies,
float32 GEMM outputs cast afterwards, work tensors kept between steps), so the trace can be checked against the emulated
card.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import is_fake

from hpu_nb.emulator.fp8.numerics import (
    amax_value,
    fp8_grid_mm,
    fused_rounding_applies,
    inverse_scale,
    max_with_nan,
    quantize_with_amax,
    scale_value,
)
from hpu_nb.runtime.fp8.recipe import DelayedScaling, as_recipe

INPUT, WEIGHT, GRAD = 0, 1, 2
DEFAULT_HISTORY = DelayedScaling().amax_history_len


def activation_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype an fp8 layer returns, as the transformer engine's Linear picks it (NVIDIA TE 1.x, which Habana's
    adapts): autocast's dtype where autocast is on for the input's device, else the input's own. lightning-habana's
    tests, run on Gaudi 2, assert float32 outputs and gradients of a te.Linear fed float32 without autocast."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


class Fp8State:
    """The process's fp8 state, as the transformer engine's FP8GlobalStateManager keeps it (class-level, one per
    process): whether fp8 is on, the recipe of the innermost region, whether it calibrates, how deep regions nest."""

    enabled = False
    calibrating = False
    recipe: Any = None  # the recipe object the region was given (te's DelayedScaling, hpu_nb's, or a dict)
    depth = 0
    # Whose bytes fp8 layers allocate on fake tensors (a plan's trace): "gaudi" (Habana's transformer engine: 1-byte fp8
    # operands) or "emulated" (this emulation's eager path: float32 operands, reused work tensors). See the module doc.
    traced_layout = "gaudi"
    _converted: tuple[Any, DelayedScaling | None] = (None, None)

    @classmethod
    def hpu_nb_recipe(cls) -> DelayedScaling:
        """The region's recipe as hpu_nb's DelayedScaling (converted once per recipe object)."""
        source, converted = cls._converted
        if converted is None or source is not cls.recipe:
            converted = as_recipe(cls.recipe)
            cls._converted = (cls.recipe, converted)
        return converted

    @classmethod
    def reset(cls) -> None:
        cls.enabled, cls.calibrating, cls.recipe, cls.depth = False, False, None, 0
        cls.traced_layout = "gaudi"
        cls._converted = (None, None)


def fp8_support() -> tuple[bool, str]:
    """(available, reason) for the emulated card in force: fp8 needs Gaudi2 or newer, as on a Gaudi."""
    from hpu_nb.emulator import hpu_device  # noqa: PLC0415 -- lazy: the emulated card; core imports this on a Gaudi too

    return hpu_device.card_config().generation.fp8_support()


@contextlib.contextmanager
def fp8_region(enabled: bool = True, recipe: Any = None, calibrating: bool = False) -> Iterator[None]:
    """fp8 for the fp8 layers inside the block (nests; the innermost region decides). `recipe=None` means the default
    DelayedScaling, as te.fp8_autocast. Refused on a first-generation Gaudi, as Habana's engine refuses there."""
    if enabled:
        ok, reason = fp8_support()
        if not ok:
            raise RuntimeError(f"fp8_autocast(enabled=True): {reason}")
    recipe = recipe if recipe is not None else DelayedScaling()
    as_recipe(recipe)  # refuse a recipe the emulation cannot run before the block starts
    previous = (Fp8State.enabled, Fp8State.calibrating, Fp8State.recipe)
    Fp8State.enabled, Fp8State.calibrating, Fp8State.recipe = bool(enabled), bool(calibrating), recipe
    Fp8State.depth += 1
    try:
        yield
    finally:
        Fp8State.depth -= 1
        Fp8State.enabled, Fp8State.calibrating, Fp8State.recipe = previous


def fp8_enabled() -> bool:
    return Fp8State.enabled


def active_recipe() -> DelayedScaling | None:
    """The recipe of the enclosing fp8 region as hpu_nb's DelayedScaling, None outside any region."""
    return Fp8State.hpu_nb_recipe() if Fp8State.recipe is not None else None


TRACED_LAYOUTS = ("gaudi", "emulated")


@contextlib.contextmanager
def fp8_traced_layout(layout: str) -> Iterator[None]:
    """Inside the block, fp8 layers traced on fake tensors allocate as `layout` holds fp8 ("gaudi": Habana's
    transformer engine, the default; "emulated": this emulation's eager path, what the emulated card measures)."""
    if layout not in TRACED_LAYOUTS:
        raise ValueError(f"layout={layout!r}: choose one of {TRACED_LAYOUTS}.")
    previous = Fp8State.traced_layout
    Fp8State.traced_layout = layout
    try:
        yield
    finally:
        Fp8State.traced_layout = previous


@contextlib.contextmanager
def emulated_fp8_autocast(enabled: bool = True, recipe: Any = None) -> Iterator[None]:
    """hpu_nb's name for te.fp8_autocast on the emulated Gaudi (the same state; an explicit recipe=None keeps the
    enclosing region's recipe, so a layer built with its own recipe keeps it)."""
    with fp8_region(enabled, recipe if recipe is not None else Fp8State.recipe):
        yield


def scales_from_amaxes(amaxes: list[float], recipe: DelayedScaling) -> list[float]:
    """The scales of (input, weight, gradient) from their amaxes: numerics.scale_from_amax for each, in its format."""
    fmt = recipe.fp8_format
    dtypes = (fmt.forward_dtype, fmt.forward_dtype, fmt.backward_dtype)
    return [scale_value(a, d, recipe.margin) for a, d in zip(amaxes, dtypes)]


class _Fp8Matmul(torch.autograd.Function):
    """y = x W^T + b with fp8 operands; the backward pass quantises the gradient too (it is where E5M2 is used).

    Scales are read once as float32 values; the inverse-scale factors are formed as torch._scaled_mm's are."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, layer: Fp8Linear,
        recipe: DelayedScaling,
    ) -> torch.Tensor:
        fwd = recipe.fp8_format.forward_dtype
        out_dtype = activation_dtype(x)
        x2 = x.reshape(-1, x.shape[-1])
        sx, sw, _ = layer.scale.tolist()
        with torch.autocast(x.device.type, enabled=False):  # the plugin's autocast must not lower these matmuls
            xq, x_amax = layer._quantize("x", x2, sx, fwd, out=layer._take_buffer("x", x2))
            wq, w_amax = layer._quantize("w", weight, sw, fwd, out=layer._take_buffer("w", weight))
            out = fp8_grid_mm(xq, wq.t(), inverse_scale(sx, sw), bias)
        if layer.training:  # delayed scaling: this step used the history's scales, it records its own amaxes
            layer._record(INPUT, x_amax)
            layer._record(WEIGHT, w_amax)
        if any(ctx.needs_input_grad):
            ctx.save_for_backward(xq, wq)
        else:  # no backward will come for them
            layer._give_back("x", xq)
            layer._give_back("w", wq)
        ctx.layer, ctx.recipe, ctx.sx, ctx.sw, ctx.has_bias = layer, recipe, sx, sw, bias is not None
        ctx.x_shape, ctx.x_dtype, ctx.w_dtype = x.shape, x.dtype, weight.dtype
        ctx.b_dtype = bias.dtype if bias is not None else None
        return out.to(out_dtype).reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple:  # type: ignore[override]
        xq, wq = ctx.saved_tensors
        layer: Fp8Linear = ctx.layer
        g2 = grad_out.reshape(-1, grad_out.shape[-1])
        sg = float(layer.scale[GRAD])
        grad_x = grad_w = grad_b = None
        with torch.autocast(grad_out.device.type, enabled=False):
            gq, g_amax = layer._quantize("g", g2, sg, ctx.recipe.fp8_format.backward_dtype,
                                         out=layer._scratch_for("gq", g2), need_amax=True)
            layer._record(GRAD, g_amax)
            if ctx.needs_input_grad[0]:
                grad_x = fp8_grid_mm(gq, wq, inverse_scale(sg, ctx.sw)).to(ctx.x_dtype).reshape(ctx.x_shape)
            if ctx.needs_input_grad[1]:
                grad_w = fp8_grid_mm(gq.t(), xq, inverse_scale(sg, ctx.sx)).to(ctx.w_dtype)
            if ctx.has_bias and ctx.needs_input_grad[2]:
                grad_b = g2.float().sum(0).to(ctx.b_dtype)
        layer._give_back("x", xq)
        layer._give_back("w", wq)
        return grad_x, grad_w, grad_b, None, None


class _TracedFp8Matmul(torch.autograd.Function):
    """_Fp8Matmul's allocations on fake tensors (see the module doc): the same shapes, dtypes and lifetimes as the
    layout of Fp8State.traced_layout, the same GEMMs (so FlopCounterMode counts them); the scales stay tensors and no
    value is read."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, layer: Fp8Linear,
        recipe: DelayedScaling,
    ) -> torch.Tensor:
        gaudi = Fp8State.traced_layout == "gaudi"
        fwd = recipe.fp8_format.forward_dtype
        out_dtype = activation_dtype(x)
        x2 = x.reshape(-1, x.shape[-1])
        with torch.autocast(x.device.type, enabled=False):
            if gaudi:  # cast_to_fp8 of input and weight, one fp8 GEMM writing the activation dtype, bias fused
                xq, wq = x2.to(fwd), weight.to(fwd)
                inverse = layer.scale.reciprocal()
                out = torch._scaled_mm(xq, wq.t(), scale_a=inverse[INPUT], scale_b=inverse[WEIGHT],
                                       out_dtype=out_dtype)
                if bias is not None:
                    out.add_(bias)
            else:  # as _Fp8Matmul.forward: float32 operands from the layer's buffers, a float32 GEMM, then the cast
                xq, wq = layer._traced_operand("x", x2), layer._traced_operand("w", weight)
                out = torch.addmm(bias.float(), xq, wq.t()) if bias is not None else torch.mm(xq, wq.t())
                out = out.to(out_dtype)
        if any(ctx.needs_input_grad):
            ctx.save_for_backward(xq, wq)
        elif not gaudi:
            layer._give_back("x", xq)
            layer._give_back("w", wq)
        ctx.layer, ctx.recipe, ctx.gaudi, ctx.has_bias = layer, recipe, gaudi, bias is not None
        ctx.x_shape, ctx.x_dtype, ctx.w_dtype = x.shape, x.dtype, weight.dtype
        ctx.b_dtype = bias.dtype if bias is not None else None
        return out.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple:  # type: ignore[override]
        xq, wq = ctx.saved_tensors
        layer: Fp8Linear = ctx.layer
        g2 = grad_out.reshape(-1, grad_out.shape[-1])
        grad_x = grad_w = grad_b = None
        with torch.autocast(grad_out.device.type, enabled=False):
            if ctx.gaudi:  # cast_to_fp8 of the gradient (E5M2), dgrad / wgrad GEMMs in their own dtypes
                gq = g2.to(ctx.recipe.fp8_format.backward_dtype)
                inverse = layer.scale.reciprocal()
                if ctx.needs_input_grad[0]:
                    grad_x = torch._scaled_mm(gq, wq, scale_a=inverse[GRAD], scale_b=inverse[WEIGHT],
                                              out_dtype=ctx.x_dtype).reshape(ctx.x_shape)
                if ctx.needs_input_grad[1]:
                    grad_w = torch._scaled_mm(gq.t(), xq, scale_a=inverse[GRAD], scale_b=inverse[INPUT],
                                              out_dtype=ctx.w_dtype)
                if ctx.has_bias and ctx.needs_input_grad[2]:
                    grad_b = g2.sum(0).to(ctx.b_dtype)
            else:  # as _Fp8Matmul.backward
                gq = layer._scratch_for("gq", g2)
                if not fused_rounding_applies(g2):
                    layer._scratch_for("g", g2)
                if ctx.needs_input_grad[0]:
                    grad_x = torch.mm(gq, wq).to(ctx.x_dtype).reshape(ctx.x_shape)
                if ctx.needs_input_grad[1]:
                    grad_w = torch.mm(gq.t(), xq).to(ctx.w_dtype)
                if ctx.has_bias and ctx.needs_input_grad[2]:
                    grad_b = g2.float().sum(0).to(ctx.b_dtype)
                layer._give_back("x", xq)
                layer._give_back("w", wq)
        return grad_x, grad_w, grad_b, None, None


class _WorkTensors(NamedTuple):
    """An Fp8Linear's reused float32 tensors (allocating large ones anew each step costs faulting in their pages):
    work space by role, and, by role, fp8-valued operands whose backward is done. A named tuple of containers, so
    torch's pytree (and a plan's count of what a module holds between steps) sees the tensors."""

    scratch: dict[str, torch.Tensor]
    free: dict[str, list[torch.Tensor]]

    @classmethod
    def empty(cls) -> _WorkTensors:
        return cls({}, {})


class Fp8Linear(torch.nn.Module):
    """A linear layer with emulated fp8 matmuls inside an fp8 region; plain linear outside one.

    `Fp8Linear(linear, recipe=None)` takes over `linear`'s Parameters (the same objects: trained values kept,
    optimizers still see them). With a recipe the layer keeps it; without one it follows the fp8 region's recipe, as
    te.Linear does. State (per layer, in buffers): the amax history of input, weight and gradient, their scales.
    """

    def __init__(self, linear: torch.nn.Linear, recipe: Any = None) -> None:
        super().__init__()
        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(f"Fp8Linear wraps an nn.Linear, got {type(linear).__name__}.")
        self._setup(linear.in_features, linear.out_features, linear.weight, linear.bias, recipe,
                    linear.weight.device)

    def _setup(self, in_features: int, out_features: int, weight: torch.nn.Parameter | None,
               bias: torch.nn.Parameter | None, recipe: Any, device: Any) -> None:
        self.in_features, self.out_features = in_features, out_features
        self.weight = weight
        self.bias = bias
        self.recipe: DelayedScaling | None = as_recipe(recipe) if recipe is not None else None
        history = self.recipe.amax_history_len if self.recipe is not None else DEFAULT_HISTORY
        self.register_buffer("amax_history", torch.zeros(history, 3, device=device))
        self.register_buffer("scale", torch.ones(3, device=device))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long, device=device))
        self._pending: list[list[float]] = [[], [], []]  # this step's amaxes, folded in on the next step
        self._work = _WorkTensors.empty()

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, recipe: Any = None) -> Fp8Linear:
        return cls(linear, recipe)

    def _record(self, which: int, value: float | None) -> None:
        assert value is not None
        self._pending[which].append(value)

    def _quantize(self, role: str, x: torch.Tensor, scale: float, dtype: torch.dtype, out: torch.Tensor | None,
                  need_amax: bool | None = None) -> tuple[torch.Tensor, float | None]:
        """numerics.quantize_with_amax with this layer's work tensor for `role` (only where the torch passes run);
        the amax is needed in training (None: `self.training`)."""
        scratch = None if fused_rounding_applies(x) else self._scratch_for(role, x)
        need = self.training if need_amax is None else need_amax
        return quantize_with_amax(x, scale, dtype, need_amax=need, scratch=scratch, out=out)

    def _work_for(self, like: torch.Tensor) -> _WorkTensors:
        """The work tensors for `like`'s kind: a trace on fake tensors keeps its own (set as a new attribute, which the
        planner removes afterwards), never mixed with real ones."""
        if not is_fake(like):
            return self._work
        traced = self.__dict__.get("_traced_work")
        if traced is None:
            traced = self._traced_work = _WorkTensors.empty()
        return traced

    def _scratch_for(self, role: str, like: torch.Tensor) -> torch.Tensor:
        """A float32 work tensor shaped like `like`, kept between steps (it never leaves this layer's computation)."""
        work = self._work_for(like)
        scratch = work.scratch.get(role)
        if scratch is None or scratch.shape != like.shape or scratch.device != like.device:
            scratch = work.scratch[role] = torch.empty(like.shape, dtype=torch.float32, device=like.device)
        return scratch

    def _take_buffer(self, role: str, like: torch.Tensor) -> torch.Tensor | None:
        """A float32 tensor shaped like `like` whose last backward is done (None: allocate one). Were a retained
        graph's backward run again after this reuse, autograd would refuse it (a saved tensor changed), never compute
        with the new values."""
        free = self._work_for(like).free.get(role, [])
        while free:
            buffer = free.pop()
            if buffer.shape == like.shape and buffer.device == like.device:
                return buffer
        return None

    def _give_back(self, role: str, buffer: torch.Tensor) -> None:
        free = self._work_for(buffer).free.setdefault(role, [])
        if len(free) < 2:
            free.append(buffer)

    def _traced_operand(self, role: str, x: torch.Tensor) -> torch.Tensor:
        """What _quantize(role, x, ..., out=_take_buffer(role, x)) allocates, on fake tensors: the float32 operand
        (a buffer given back, else a new one) and, where the one-pass kernel does not run, the work tensor."""
        out = self._take_buffer(role, x)
        if not fused_rounding_applies(x):
            self._scratch_for(role, x)
        if out is None or not out.is_contiguous():
            out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
        return out

    def _fit_history(self, length: int) -> None:
        """Keep `length` rows of amax history (the region's recipe may ask for another length than the layer has)."""
        rows = self.amax_history.shape[0]
        if rows == length:
            return
        kept = self.amax_history[: min(rows, length)]
        grown = torch.zeros(length, 3, dtype=kept.dtype, device=kept.device)
        grown[: kept.shape[0]] = kept
        self.amax_history = grown

    def _roll_history(self, recipe: DelayedScaling) -> None:
        """Delayed scaling: fold the last step's amaxes into the history, and every `interval` steps rescale."""
        if not any(self._pending):
            return
        self._fit_history(recipe.amax_history_len)
        history = self.amax_history
        newest = [max_with_nan(values) for values in self._pending]
        self._pending = [[], [], []]
        row = torch.tensor([newest], dtype=history.dtype).to(history.device)
        history.copy_(torch.cat((row, history[:-1])))  # row 0: the newest
        self.steps += 1
        if recipe.interval == 1 or int(self.steps) % recipe.interval == 0:
            current = history.amax(dim=0).tolist() if recipe.amax_compute_algo == "max" else newest
            old = self.scale.tolist()
            new = [s if a > 0 else o for s, a, o in zip(scales_from_amaxes(current, recipe), current, old)]
            if new != old:
                self.scale.copy_(torch.tensor(new, dtype=self.scale.dtype))

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        traced = is_fake(x) or is_fake(weight)  # a plan's trace: no values to read (see the module doc)
        if not Fp8State.enabled:
            # te's calibration: statistics from a higher-precision run (none on fake tensors)
            if Fp8State.calibrating and self.training and not traced:
                self._roll_history(self.recipe or Fp8State.hpu_nb_recipe())
                self._record(INPUT, amax_value(x))
                self._record(WEIGHT, amax_value(weight))
            return F.linear(x, weight, bias)
        recipe = self.recipe or Fp8State.hpu_nb_recipe()
        if traced:
            return _TracedFp8Matmul.apply(x, weight, bias, self, recipe)
        if self.training:
            self._roll_history(recipe)
        return _Fp8Matmul.apply(x, weight, bias, self, recipe)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        text = f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
        r = self.recipe
        if r is not None:
            text += f", fp8_format={r.fp8_format.name}, amax_history_len={r.amax_history_len}, margin={r.margin}"
        return text


__all__ = ["TRACED_LAYOUTS", "Fp8Linear", "Fp8State", "active_recipe", "emulated_fp8_autocast", "fp8_enabled",
           "fp8_region", "fp8_support", "fp8_traced_layout"]

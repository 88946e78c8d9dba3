"""One training step of the user's LightningModule, run on fake `hpu` tensors: what it holds, when, and its FLOPs.

torch's FakeTensorMode gives every tensor its shape, dtype and device without storage, so a 7B model on the meta
device "trains" here in seconds and without its memory. torch's MemTracker (torch.distributed._tools.mem_tracker) sorts
every live storage into parameters, buffers, gradients, activations (made in forward), temporaries (made in backward)
and optimizer state and records the snapshot at the peak; FlopCounterMode counts the matmul / convolution / attention
FLOPs. Nothing here allocates device memory: the card's memory counters stay as they were (tests/plan).

The step is Lightning's automatic optimization, in its order (lightning.pytorch.loops.optimization.automatic: the
closure runs training_step, then zero_grad, then backward; then optimizer.step): so the previous step's gradients are
still alive during the next forward, as on the card. Two steps run, so the optimizer's state exists in the second.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["PlanError", "StepTrace", "fake_batch", "first_batch", "trace_step"]

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "temporaries", "batch")


class PlanError(RuntimeError):
    """The step cannot run on fake tensors (it reads a tensor's values, or uses an op with no shape rule)."""


@dataclass
class StepTrace:
    """What one traced step holds on one card at its peak (bytes by category) and how much work it does."""

    peak_bytes: int
    breakdown: dict[str, int]  # CATEGORIES -> bytes at the moment of the peak
    flops: int  # one step (the second), forward + backward, as FlopCounterMode counts
    traffic_bytes: int  # bytes every op of that step reads and writes (no fusion): the memory-bound time's input
    param_elements: int  # elements of the trainable parameters
    param_bytes: int  # bytes of all parameters and buffers, as traced
    trainable_bytes: int  # bytes of the trainable parameters (their gradients' bytes)
    optimizer_states_per_element: float  # optimizer state tensors per trainable element (Adam: 2)
    largest_module_elements: int  # the largest module's own parameters (DeepSpeed's "largest layer")
    largest_block_elements: int  # the largest repeated block (a ModuleList's child): FSDP's wrapping unit
    param_sizes: list[int] = field(default_factory=list)  # elements of each trainable parameter (ZeRO-3 persistence)
    host_bytes: int = 0  # state the optimizer keeps on the host (e.g. Adam's `step` counters)
    notes: list[str] = field(default_factory=list)


# -- batches -------------------------------------------------------------------------------------------------------
def first_batch(batch: Any) -> Any:
    """One batch from what the user gave: tensors as they are, or the first batch of a DataLoader or of a
    LightningDataModule's train_dataloader() (set up for "fit")."""
    # a LightningDataModule of either package (lightning.pytorch or the standalone pytorch_lightning)
    if callable(getattr(batch, "train_dataloader", None)) and callable(getattr(batch, "setup", None)):
        if callable(getattr(batch, "prepare_data", None)):
            batch.prepare_data()
        batch.setup("fit")
        batch = batch.train_dataloader()
    if isinstance(batch, torch.utils.data.DataLoader):
        return next(iter(batch))
    return batch


def batch_size_of(batch: Any) -> int:
    """The size of the batch's first dimension (every tensor of a batch shares it)."""
    tensors = [t for t in tree_flatten(batch)[0] if isinstance(t, torch.Tensor) and t.dim() > 0]
    if not tensors:
        raise ValueError("batch holds no tensor with a batch dimension: pass one batch of tensors, a DataLoader or a "
                         "LightningDataModule.")
    return int(tensors[0].shape[0])


def fake_batch(batch: Any, device: torch.device, size: int | None = None,
               float_dtype: torch.dtype | None = None) -> Any:
    """The batch as fake tensors on `device` (call inside the FakeTensorMode), its first dimension `size` if given,
    floating tensors in `float_dtype` if given (DeepSpeed's engine casts its inputs). Values are not kept."""

    def convert(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            shape = list(obj.shape)
            if size is not None and shape:
                shape[0] = size
            dtype = float_dtype if float_dtype is not None and obj.is_floating_point() else obj.dtype
            return torch.empty(shape, dtype=dtype, device=device)
        if isinstance(obj, dict):
            return type(obj)((key, convert(value)) for key, value in obj.items())
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
            return type(obj)(*(convert(value) for value in obj))
        if isinstance(obj, (list, tuple)):
            return type(obj)(convert(value) for value in obj)
        return obj

    return convert(batch)


# -- the model on fake tensors, given back untouched ---------------------------------------------------------------
@contextlib.contextmanager
def model_on_fake_device(model: nn.Module, device: torch.device) -> Iterator[nn.Module]:
    """The user's model with every parameter and buffer replaced by a fake one on `device` (same shape, dtype,
    requires_grad; a tied parameter stays tied), for the duration; its own tensors, submodules and mode come back
    after, whatever happens, and attributes the step set on a module (a layer's cached work tensors) are removed.
    The model is not copied: a model held in host RAM is not held twice."""
    saved = [(module, dict(module._parameters), dict(module._buffers), dict(module._modules))
             for module in model.modules()]
    attributes = {module: set(module.__dict__) for module in model.modules()}  # what the step adds goes after it
    training = {module: module.training for module in model.modules()}
    fakes: dict[int, torch.Tensor] = {}

    def fake_of(tensor: torch.Tensor, parameter: bool) -> torch.Tensor:
        if id(tensor) not in fakes:
            empty = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device=device)
            fakes[id(tensor)] = nn.Parameter(empty, requires_grad=tensor.requires_grad) if parameter else empty
        return fakes[id(tensor)]

    try:
        for module, params, buffers, _ in saved:
            for name, param in params.items():
                if param is not None:
                    module._parameters[name] = fake_of(param, parameter=True)  # type: ignore[assignment]
            for name, buffer in buffers.items():
                if buffer is not None:
                    module._buffers[name] = fake_of(buffer, parameter=False)
        yield model
    finally:
        for module, params, buffers, modules in saved:
            module._parameters.clear()
            module._parameters.update(params)
            module._buffers.clear()
            module._buffers.update(buffers)
            module._modules.clear()
            module._modules.update(modules)
        for module, was_training in training.items():
            module.training = was_training
        for module, names in attributes.items():  # e.g. work tensors an fp8 layer keeps between steps: fake ones
            for name in set(module.__dict__) - names:
                delattr(module, name)


def module_sizes(model: nn.Module) -> tuple[int, int]:
    """(largest module's own trainable elements, largest repeated block's elements): DeepSpeed's estimator takes the
    first ("largest_layer_params"), FSDP gathers one wrapped block at a time (the second; the whole model where no
    nn.ModuleList holds blocks)."""
    largest_own = max((sum(p.numel() for p in m.parameters(recurse=False) if p.requires_grad)
                       for m in model.modules()), default=0)
    blocks = [sum(p.numel() for p in child.parameters() if p.requires_grad)
              for m in model.modules() if isinstance(m, nn.ModuleList) for child in m]
    total = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return largest_own, max(blocks, default=total)


# -- the step --------------------------------------------------------------------------------------------------------
class _TrafficCounter(TorchDispatchMode):
    """Bytes each op reads and writes (its tensor inputs and outputs), summed: the unfused memory traffic."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten((args, kwargs, out))[0]:
            if isinstance(tensor, torch.Tensor):
                self.bytes += tensor.numel() * tensor.element_size()
        return out


def _peak_tracker() -> Any:
    """torch's MemTracker keeping the device-wide peak only: its per-module peaks (which the plan does not show) walk
    every tracked module on every op, the bulk of a 7B trace's time. Overrides MemTracker._update_peak_stats (a
    private method, torch 2.13): tests/plan checks the planned peak against the card's own counters."""
    from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker  # noqa: PLC0415

    class PeakTracker(MemTracker):
        def _update_peak_stats(self, peak_state: Any) -> None:
            for dev, dev_snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < dev_snap[_TOTAL_KEY]:
                    self._peak_mem[dev] = dev_snap[_TOTAL_KEY]
                    self._peak_mem_snap[dev] = dict(dev_snap)

    return PeakTracker()


def _attention_flop_formulas() -> dict[Any, Callable[..., int]]:
    """FlopCounterMode's SDPA formulas for the attention kernel torch picks for `hpu` tensors off a Gaudi (the CPU
    flash kernel, which torch's counter has no entry for): the same counts as its other SDPA kernels."""
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count  # noqa: PLC0415

    aten = torch.ops.aten

    def forward(query: Any, key: Any, value: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
        return int(sdpa_flop_count(query, key, value))

    def backward(grad_out: Any, query: Any, key: Any, value: Any, *args: Any, out_val: Any = None,
                 **kwargs: Any) -> int:
        return int(sdpa_backward_flop_count(grad_out, query, key, value))

    return {aten._scaled_dot_product_flash_attention_for_cpu: forward,  # FlopCounterMode keys: op packets
            aten._scaled_dot_product_flash_attention_for_cpu_backward: backward}


class _WholeStepOnly:
    """A module tracker that places every op in "Global" (the step's total, all the plan reads) and hooks nothing."""

    parents = frozenset({"Global"})

    def __enter__(self) -> _WholeStepOnly:
        return self

    def __exit__(self, *args: object) -> None:
        return None


def _total_flop_counter(counter: Any) -> Any:
    """torch's FlopCounterMode counting the step's total only. Its per-module ModuleTracker (a breakdown the plan does
    not show) hooks every module's outputs for their gradients; a module activation checkpointing re-runs in backward
    gets hooks whose closures keep the recomputed tensors in reference cycles until Python's garbage collector runs, so
    the traced peak counted them (1.07-1.16 of the card's MaxInUse, as gc happened to run). Replaces
    FlopCounterMode.mod_tracker (torch 2.13's attribute: tests/plan's tripwire checks it)."""
    counter.mod_tracker = _WholeStepOnly()
    return counter


def _optimizers_of(model: nn.Module) -> list[torch.optim.Optimizer]:
    from lightning.pytorch.core.optimizer import _configure_optimizers  # noqa: PLC0415 -- Lightning's normaliser

    configured = model.configure_optimizers()  # type: ignore[operator]
    if configured is None:
        raise PlanError("configure_optimizers() returned None: the plan needs the optimizer the run will use.")
    optimizers, _, _ = _configure_optimizers(configured)
    return list(optimizers)


def _loss_of(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict) and isinstance(output.get("loss"), torch.Tensor):
        return output["loss"]
    raise PlanError("training_step returned neither a loss tensor nor a dict with 'loss': nothing to backpropagate.")


def trace_step(
    model: nn.Module,
    batch: Any,
    *,
    device: torch.device,
    forward_context: Callable[[], contextlib.AbstractContextManager[Any]],
    scale_loss: bool = False,
    param_dtype: torch.dtype | None = None,
    prepare: Callable[[nn.Module], nn.Module] | None = None,
    batch_size: int | None = None,
) -> StepTrace:
    """Run two training steps of `model` on `batch` (tensors, as first_batch gives) on fake tensors on `device`.

    forward_context: the precision's forward context (autocast on "hpu" with Habana's op lists, fp8 autocast).
    scale_loss: a loss scaler's work ("16-mixed"): the loss scaled, the gradients unscaled and checked for inf.
    param_dtype: cast the fake parameters to this dtype first (DeepSpeed's bf16 engine holds bf16 weights).
    prepare: a conversion of the model before the step (fp8: nn.Linear -> fp8 layers).
    batch_size: the batch's first dimension made this size (the batch-size sweep).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: PLC0415
    from torch.distributed._tools.mem_tracker import _MemRefType  # noqa: PLC0415
    from torch.utils.flop_counter import FlopCounterMode  # noqa: PLC0415

    from hpu_nb.core.mixed_precision import non_finite_check_and_unscale_  # noqa: PLC0415

    if not hasattr(model, "training_step") or not hasattr(model, "configure_optimizers"):
        raise TypeError(f"model must be a LightningModule (training_step, configure_optimizers), got "
                        f"{type(model).__name__}.")
    if getattr(model, "automatic_optimization", True) is False:
        raise PlanError("the plan runs Lightning's automatic optimization; this model sets automatic_optimization="
                        "False (manual_backward / self.optimizers() need a Trainer). Plan a variant with automatic "
                        "optimization, or measure a smaller run on the emulated card.")
    with FakeTensorMode(allow_non_fake_inputs=True), model_on_fake_device(model, device), \
            _user_frames(model), _quiet_log(model):
        if param_dtype is not None:
            cast: dict[int, nn.Parameter] = {}
            for module in model.modules():
                for name, param in module._parameters.items():
                    if param is not None and param.is_floating_point():
                        if id(param) not in cast:  # a tied parameter stays tied
                            cast[id(param)] = nn.Parameter(param.detach().to(param_dtype),
                                                           requires_grad=param.requires_grad)
                        module._parameters[name] = cast[id(param)]
        if prepare is not None:
            model = prepare(model)
            # what the conversion made elsewhere (te.Linear's scaling state is made on the host) goes to the card, as
            # Lightning's model_to_device moves it after the precision plugin's convert_module
            for module in model.modules():
                for name, buffer in module._buffers.items():
                    if buffer is not None and buffer.device != device:
                        module._buffers[name] = buffer.to(device)
        model.train()
        largest_own, largest_block = module_sizes(model)
        optimizers = _optimizers_of(model)
        inputs = fake_batch(batch, device, size=batch_size, float_dtype=param_dtype)

        def one_step(step: int) -> None:
            with forward_context():
                output = model.training_step(inputs, step)  # type: ignore[operator]
            loss = _loss_of(output)
            for optimizer in optimizers:
                optimizer.zero_grad(set_to_none=True)
            if scale_loss:
                loss = loss * torch.full((), 2.0**16, device=device)
            loss.backward()
            del output, loss
            for optimizer in optimizers:
                if scale_loss:
                    grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
                    found_inf = torch.zeros((), device=device)
                    non_finite_check_and_unscale_(grads, found_inf, torch.full((), 2.0**-16, device=device))
                    del grads, found_inf  # held past zero_grad, they would be counted twice
                optimizer.step()

        # The first step makes the optimizer's state and leaves the gradients; the second holds all the first held
        # at each point and more, so its peak is the run's: only it is tracked (half the tracing time).
        one_step(0)
        tracker = _peak_tracker()
        for held in _held_between_steps(model, device):  # made in the first step, kept: counted as temporaries
            tracker._update_and_maybe_create_winfos(held, _MemRefType.TEMP)
        tracker.track_external(model, *optimizers)  # parameters, buffers, their gradients, the optimizer's state
        tracker.track_external(*[t for t in tree_flatten(inputs)[0] if isinstance(t, torch.Tensor)])
        flops = _total_flop_counter(FlopCounterMode(display=False, custom_mapping=_attention_flop_formulas()))
        traffic = _TrafficCounter()
        with tracker, flops, traffic:
            one_step(1)
        snapshot = tracker.get_tracker_snapshot("peak").get(device, {})
        host = tracker.get_tracker_snapshot("current").get(torch.device("cpu"), {})
        kinds = {
            "parameters": snapshot.get(_MemRefType.PARAM, 0) + snapshot.get(_MemRefType.BUFFER, 0),
            "gradients": snapshot.get(_MemRefType.GRAD, 0),
            "optimizer_state": snapshot.get(_MemRefType.OPT, 0),
            "activations": snapshot.get(_MemRefType.ACT, 0),
            "temporaries": snapshot.get(_MemRefType.TEMP, 0),
            "batch": snapshot.get(_MemRefType.OTH, 0),
        }
        trainable = [p for p in model.parameters() if p.requires_grad]
        elements = sum(p.numel() for p in trainable)
        param_bytes = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
        state_elements = sum(value.numel() for opt in optimizers for state in opt.state.values()
                             for value in state.values()
                             if isinstance(value, torch.Tensor) and value.dim() > 0 and value.device == device)
        return StepTrace(
            peak_bytes=int(sum(kinds.values())),
            breakdown={key: int(value) for key, value in kinds.items()},
            flops=int(flops.get_total_flops()),
            traffic_bytes=int(traffic.bytes),
            param_elements=int(elements),
            param_bytes=int(param_bytes),
            trainable_bytes=int(sum(p.numel() * p.element_size() for p in trainable)),
            optimizer_states_per_element=state_elements / elements if elements else 0.0,
            largest_module_elements=int(largest_own),
            largest_block_elements=int(largest_block),
            param_sizes=[int(p.numel()) for p in trainable],
            host_bytes=int(host.get("Total", 0)),
        )


_MODULE_STATE = ("_parameters", "_buffers", "_modules")


def _held_between_steps(model: nn.Module, device: torch.device) -> list[torch.Tensor]:
    """Tensors on `device` a module keeps as plain attributes (not parameters or buffers) after a step, e.g. the work
    tensors an fp8 layer reuses from step to step: torch's MemTracker sees only what is made while it tracks and
    what it is given, so these are given to it (MemTracker.track_external would file them under "other")."""
    held = []
    for module in model.modules():
        values = [value for name, value in module.__dict__.items() if name not in _MODULE_STATE]
        held += [t for t in tree_flatten(values)[0] if isinstance(t, torch.Tensor) and t.device == device]
    return held


@contextlib.contextmanager
def _quiet_log(model: nn.Module) -> Iterator[None]:
    """self.log(...) without a Trainer only warns; with fake values it could not log anyway: silenced for the step."""
    if not hasattr(model, "log"):
        yield
        return
    model.log = lambda *args, **kwargs: None  # type: ignore[method-assign,assignment]
    model.log_dict = lambda *args, **kwargs: None  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        del model.log, model.log_dict


# -- bad input: say which op, where, and what to do ----------------------------------------------------------------
_WHAT_TO_DO = (
    "Planning runs the step on fake tensors, which have shapes but no values. Make the step shape-static (no .item(), "
    "no value-dependent shapes) for planning, or measure instead: run a smaller configuration for a step on the "
    "emulated card (hpu_nb's MemoryMonitor, or torch.hpu.max_memory_allocated()) and scale from there."
)


@contextlib.contextmanager
def _user_frames(model: nn.Module) -> Iterator[None]:
    """Turn fake-tensor refusals into a PlanError naming the op and the user's line that asked for it."""
    from torch._subclasses.fake_tensor import (  # noqa: PLC0415
        DataDependentOutputException,
        DynamicOutputShapeException,
        UnsupportedOperatorException,
    )

    try:
        yield
    except PlanError:
        raise
    except DataDependentOutputException as error:
        raise PlanError(f"{_where(error)} reads a tensor's value ({error.func}, e.g. .item() / .tolist() / "
                        f"bool(tensor)). {_WHAT_TO_DO}") from error
    except DynamicOutputShapeException as error:
        raise PlanError(f"{_where(error)} makes a tensor whose shape depends on values ({error.func}, e.g. nonzero, "
                        f"masked_select, unique). {_WHAT_TO_DO}") from error
    except UnsupportedOperatorException as error:
        raise PlanError(f"{_where(error)} calls {error.func}, which has no meta kernel (a shape rule), so it cannot "
                        f"run on fake tensors. Register one (torch.library.register_fake), or: {_WHAT_TO_DO}"
                        ) from error
    except NotImplementedError as error:
        if "meta" not in str(error).lower() and "fake" not in str(error).lower():
            raise
        raise PlanError(f"{_where(error)}: {str(error).splitlines()[0]}. The op has no meta kernel (a shape rule). "
                        f"Register one (torch.library.register_fake), or: {_WHAT_TO_DO}") from error


_LIBRARY_ROOTS = tuple(os.path.dirname(os.path.dirname(mod.__file__ or "")) for mod in (torch, contextlib))


def _where(error: BaseException) -> str:
    """'file.py:12 (`line`)': the innermost frame of the traceback outside torch, Lightning, hpu_nb.plan and the
    standard library: the user's code that asked for the op."""
    skip = (*_LIBRARY_ROOTS, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # hpu_nb itself
    user = None
    for frame in traceback.extract_tb(error.__traceback__):
        path = os.path.abspath(frame.filename)
        if "lightning" in path.split(os.sep) or path.startswith(skip):
            continue
        user = frame
    if user is None:
        return "the training step"
    code = (user.line or linecache.getline(user.filename, user.lineno or 0)).strip()
    return f"{user.filename}:{user.lineno} (`{code}`)"

"""torch's own calls that name CUDA: tensors' `.to("cuda")` / `.cuda()` / `.is_cuda`, factories' `device="cuda"`,
`torch.autocast("cuda")`, `nn.DataParallel`.

Behaviour modelled: Habana's toolkit, `torch/_tensor.py` (Tensor.to / cuda / is_cuda / record_stream),
`torch/_VariableFunctions.py` (the factories: device cuda -> hpu, pin_memory=True refused with a warning),
`torch/amp/autocast_mode.py` (device_type cuda -> hpu with dtype None: Habana's autocast picks bf16) and
`torch/nn/parallel/data_parallel.py` (DataParallel refused: one card per process on a Gaudi) and `torch/__init__.py`
(torch.compile's default inductor backend -> hpu_backend; TorchScript off unless DISABLE_JIT=0; torch.version.cuda
"11.8"). Written for the emulated
Gaudi; Habana's code is not copied. `torch.device("cuda")` itself stays a cuda device, as with Habana's toolkit: it is
turned into hpu where it is used.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from typing import Any

import torch
from habana_frameworks.torch.gpu_migration._devices import migrates, to_hpu
from habana_frameworks.torch.gpu_migration._log import HPU_MATCH, HPU_MISMATCH, HPU_MODIFIED, LOG, format_args

TYPED_DTYPES = {"FloatTensor": torch.float32, "DoubleTensor": torch.float64, "HalfTensor": torch.float16,
                "BFloat16Tensor": torch.bfloat16, "ByteTensor": torch.uint8, "CharTensor": torch.int8,
                "ShortTensor": torch.int16, "IntTensor": torch.int32, "LongTensor": torch.int64,
                "BoolTensor": torch.bool}  # torch.cuda.<name> / "torch.cuda.<name>" -> a tensor of that dtype on hpu
_FACTORIES = ("empty", "empty_like", "randn", "rand_like", "rand", "randint", "randint_like", "randn_like", "tensor",
              "zeros", "zeros_like", "arange", "range", "full", "full_like", "eye", "empty_strided", "ones",
              "ones_like", "as_tensor", "randperm")


def _factory(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def factory(*args: Any, **kwargs: Any) -> Any:
        device = kwargs.get("device")
        if device is None and not kwargs.get("pin_memory"):
            return original(*args, **kwargs)  # the common case, nothing to migrate: no cost beyond this check
        old = {"args": args, "kwargs": dict(kwargs)}
        api_type = None
        if migrates(device):
            kwargs["device"] = to_hpu(device)
            api_type = HPU_MATCH
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
            api_type = HPU_MODIFIED
            warnings.warn("habana allocator doesn't support pinned memory", stacklevel=2)
        if api_type is not None:
            LOG.record(api_type, f"torch.{name}", old, f"torch.{name}(args={args}, kwargs={{{format_args(kwargs)}}})")
        return original(*args, **kwargs)

    return factory


def _tensor_methods() -> dict[str, Any]:
    original_to = torch.Tensor.to

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Tensor.to with a cuda device (positional or `device=`, or a device index) sent to hpu."""
        new_args, new_kwargs = list(args), dict(kwargs)
        if "device" in kwargs and migrates(kwargs["device"]):
            new_kwargs["device"] = to_hpu(kwargs["device"])
        elif "device" not in kwargs and args and migrates(args[0]):
            new_args[0] = to_hpu(args[0])
        else:
            return original_to(self, *args, **kwargs)
        LOG.record(HPU_MATCH, "torch.Tensor.to", {"args": args, "kwargs": kwargs},
                   f"torch.Tensor.to(args={tuple(new_args)}, kwargs={{{format_args(new_kwargs)}}})")
        return original_to(self, *new_args, **new_kwargs)

    def cuda(self: torch.Tensor, device: Any = None, non_blocking: bool = False,
             memory_format: torch.memory_format = torch.preserve_format) -> torch.Tensor:
        """Tensor.cuda() is Tensor.to("hpu") (to "hpu:N" for cuda:N or N)."""
        target = "hpu" if device is None else to_hpu(device)
        LOG.record(HPU_MATCH, "torch.Tensor.cuda",
                   {"device": device, "non_blocking": non_blocking, "memory_format": memory_format},
                   f"torch.Tensor.to(device={target}, non_blocking={non_blocking}, memory_format={memory_format})")
        return original_to(self, device=target, non_blocking=non_blocking, memory_format=memory_format)

    original_type = torch.Tensor.type

    def type(self: torch.Tensor, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        """As Habana's: a "torch.cuda.<T>Tensor" / "torch.hpu.<T>Tensor" type (or torch.cuda.<T>Tensor) casts onto
        hpu; asked for its type, a tensor on hpu answers "torch.cuda.<T>Tensor" (CUDA code checks it)."""
        args = {"dtype": dtype, "non_blocking": non_blocking, "kwargs": kwargs}  # as Habana's log: kwargs={}
        target = getattr(dtype, "tensor_type", None)
        if isinstance(dtype, str) and dtype.startswith(("torch.cuda.", "torch.hpu.")):
            target = TYPED_DTYPES.get(dtype.rsplit(".", 1)[-1])
        if target is not None:
            LOG.record(HPU_MATCH, "torch.Tensor.type", args, f"torch.Tensor.to(device=hpu, dtype={target})")
            return original_to(self, device="hpu", dtype=target, non_blocking=non_blocking)
        if dtype is None and not kwargs and self.device.type == "hpu":
            answer = original_type(self)
            LOG.record(HPU_MATCH, "torch.Tensor.type", args,
                       f"change output value from {answer} to {answer.replace('hpu', 'cuda')}")
            return answer.replace("hpu", "cuda")
        return original_type(self, dtype, non_blocking, **kwargs)

    def record_stream(self: torch.Tensor, stream: Any) -> None:
        LOG.record(HPU_MISMATCH, "torch.Tensor.record_stream", {"s": stream}, "Dummy")

    # As Habana's: a tensor on the Gaudi says it is a "cuda" tensor, so `assert x.is_cuda` in CUDA code holds.
    is_cuda = property(lambda self: self.device.type == "hpu", doc="True for a tensor on hpu (GPU migration).")
    return {"to": to, "cuda": cuda, "type": type, "record_stream": record_stream, "is_cuda": is_cuda}


def _autocast_init() -> Callable[..., None]:
    original_init = torch.amp.autocast_mode.autocast.__init__

    def __init__(self: Any, device_type: str, dtype: torch.dtype | None = None, enabled: bool = True,
                 cache_enabled: bool | None = None) -> None:
        """torch.autocast("cuda", ...) (and torch.cuda.amp.autocast, which calls it) runs as torch.autocast("hpu")
        with dtype None: Habana's autocast chooses the lower precision (bf16), whatever fp16 the CUDA code asked."""
        if device_type.startswith("cuda"):
            old = {"device_type": device_type, "dtype": dtype, "enabled": enabled, "cache_enabled": cache_enabled}
            device_type, dtype = "hpu", None
            new = {"device_type": device_type, "dtype": dtype, "enabled": enabled, "cache_enabled": cache_enabled}
            LOG.record(HPU_MATCH, "torch.autocast.__init__", old, f"torch.autocast.__init__({format_args(new)})")
        original_init(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    return __init__


class DataParallel(torch.nn.Module):
    """nn.DataParallel, refused as Habana's toolkit refuses it: a Gaudi process drives one card (use DDP)."""

    def __init__(self, module: torch.nn.Module, device_ids: Any = None, output_device: Any = None,
                 dim: int = 0) -> None:
        super().__init__()
        LOG.record(HPU_MISMATCH, "torch.nn.DataParallel.__init__", None, "raise NotImplementedError")
        raise NotImplementedError(
            "DataParallel is currently not supported on HPU. Please use torch.nn.DistributedDataParallel instead.")


def _compile() -> Callable[..., Any]:
    original_compile = torch.compile

    @functools.wraps(original_compile)
    def compile(model: Any = None, *, backend: Any = "inductor", **kwargs: Any) -> Any:
        """torch.compile with the default backend (inductor, which generates GPU / CPU code) mapped to hpu_backend."""
        if backend == "inductor":
            LOG.record(HPU_MATCH, "torch.compile", {"backend": backend, **kwargs}, "backend=hpu_backend")
            backend = "hpu_backend"
        torch.jit._state.enable()  # as Habana's: compiling turns TorchScript back on (dynamo may script parts)
        return original_compile(model, backend=backend, **kwargs)

    return compile


def install(replace: Callable[[Any, str, Any], None]) -> None:
    # As Habana's: TorchScript is not supported on HPU, so torch.jit.script / trace hand back what they were given.
    if os.environ.get("DISABLE_JIT", "1") == "1":
        torch.jit._state.disable()
    # As Habana's: CUDA code reading torch.version.cuda finds a CUDA. Habana's torch is a build without CUDA (None
    # here on a CPU build); a CUDA build's own version is left as it is.
    if torch.version.cuda is None:
        replace(torch.version, "cuda", "11.8")
    replace(torch, "compile", _compile())
    for name in _FACTORIES:
        replace(torch, name, _factory(name, getattr(torch, name)))
    for name, method in _tensor_methods().items():
        replace(torch.Tensor, name, method)
    replace(torch.amp.autocast_mode.autocast, "__init__", _autocast_init())
    replace(torch.nn, "DataParallel", DataParallel)
    replace(torch.nn.parallel, "DataParallel", DataParallel)

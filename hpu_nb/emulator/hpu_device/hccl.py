"""The emulated Gaudi's "hccl" process-group backend: HCCL's collectives on `hpu` tensors, carried out by gloo.

Like Habana's HCCL it is registered for the `hpu` device only and refuses host tensors ("move them to the device
first"), reduces with sum / min / max natively and mean as sum / world size. gloo works on CPU aliases of the same
host memory, so results land in the hpu tensors with no copy.

The single-tensor gathers and scatters check what Habana's ProcessGroupHCCL checks (same dtype; the output holds
world size times the input's elements, or the input world size times the output's) and no shape: HCCL moves flat
buffers, so an `all_gather_into_tensor` output may be flat ([world * numel], what accelerate's `gather` sends),
concatenated ([world * N, ...]) or stacked ([world, N, ...]); gloo, which checks shapes, is handed flat views. A list
`all_gather` with outputs of different sizes is carried out, as HCCL does, by one broadcast from each rank.
Options torch does not export from torch.distributed (AllgatherOptions, in every torch from 2.7 on) are never
built here: when a caller passes none, gloo's own default is used.
"""

from __future__ import annotations

import atexit
import importlib
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup, ReduceOp

BACKEND_NAME = "hccl"
_NATIVE_OPS = {ReduceOp.SUM: "sum", ReduceOp.PRODUCT: "product", ReduceOp.MIN: "min", ReduceOp.MAX: "max"}  # HCCL's


_FP8_DTYPES = tuple(getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                                       "float8_e5m2fnuz") if hasattr(torch, name))


def _host(tensor: torch.Tensor) -> torch.Tensor:
    """The CPU alias gloo works on. fp8 tensors travel as their bytes (gloo has no fp8 type; moving them is exact)."""
    if tensor.device.type != "hpu":
        raise RuntimeError(
            f"HCCL collectives take hpu tensors, got one on {tensor.device}: move it to the device first "
            "(tensor.to('hpu')), as on a Gaudi."
        )
    host = torch.ops.hpu_emu.host_alias(tensor)
    return host.view(torch.uint8) if host.dtype in _FP8_DTYPES else host


def _hosts(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    return [_host(t) for t in tensors]


def _flat_host(tensor: torch.Tensor) -> torch.Tensor:
    """The CPU alias as the flat buffer HCCL moves (a view: what gloo writes lands in the hpu tensor)."""
    if not tensor.is_contiguous():
        raise RuntimeError("HCCL gathers and scatters contiguous tensors: call .contiguous() on the tensor first.")
    return _host(tensor).view(-1)


def _check_gather(output: torch.Tensor, input: torch.Tensor, world: int) -> None:
    """Habana's ProcessGroupHCCL checks for _allgather_base (all_gather_into_tensor): dtype and element count only."""
    if input.dtype != output.dtype:
        raise RuntimeError("output tensor must have the same type as input tensor")
    if input.numel() * world != output.numel():
        raise RuntimeError("output tensor size must be equal to world_size times input tensor size")


def _check_scatter(output: torch.Tensor, input: torch.Tensor, world: int) -> None:
    """Habana's ProcessGroupHCCL checks for _reduce_scatter_base (reduce_scatter_tensor): dtype and element count."""
    if input.dtype != output.dtype:
        raise RuntimeError("input tensor must be the same type as the output tensor.")
    if input.numel() != output.numel() * world:
        raise RuntimeError("input tensor must be the same size as output size times world size")


def _call(method: Any, *args: Any, opts: Any = None) -> Any:
    """`method(*args, opts)`, or gloo's own default options when the caller gave none (torch 2.7's `all_gather` passes
    none, and torch.distributed exports no AllgatherOptions to build one from)."""
    return method(*args) if opts is None else method(*args, opts)


def _reduce_op(op: Any) -> tuple[Any, bool]:
    """(gloo op, divide by world size afterwards)."""
    if op == ReduceOp.AVG:
        return ReduceOp.SUM, True
    for native in _NATIVE_OPS:
        if op == native:
            return native, False
    raise ValueError(f"HCCL reduces with sum, product, min, max or avg (= sum / world size), not {op}.")


class EmulatedHCCL(ProcessGroup):
    """A process group that behaves like Habana's HCCL for `hpu` tensors, over an inner gloo group."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)

    def getBackendName(self) -> str:
        return BACKEND_NAME

    @property
    def _device_types(self) -> list[torch.device]:
        return [torch.device("hpu")]

    def _get_backend(self, device: Any) -> _BackendView:
        """What torch asks of a group's per-device backend (capabilities), answered as Habana's HCCL would."""
        if torch.device(device).type != "hpu":
            raise RuntimeError(f"No backend type associated with device type {torch.device(device).type}")
        return _BackendView(self._gloo)

    def _averaged(self, work: Any, tensors: list[torch.Tensor]) -> Any:
        size = self.size()

        def divide(fut: Any) -> Any:
            for tensor in tensors:
                tensor.div_(size)
            return fut.value()

        return torch._C._distributed_c10d._create_work_from_future(work.get_future().then(divide))

    def _reduce_options(self, opts: Any, cls: type) -> tuple[Any, bool]:
        op, average = _reduce_op(opts.reduceOp)
        inner = cls()
        inner.reduceOp = op
        inner.timeout = opts.timeout
        for field in ("rootRank", "rootTensor"):
            if hasattr(opts, field):
                setattr(inner, field, getattr(opts, field))
        return inner, average

    # -- collectives ----------------------------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        opts, average = self._reduce_options(opts or dist.AllreduceOptions(), dist.AllreduceOptions)
        hosts = _hosts(tensors)
        work = self._gloo.allreduce(hosts, opts)
        return self._averaged(work, hosts) if average else work

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        opts, average = self._reduce_options(opts or dist.AllreduceCoalescedOptions(), dist.AllreduceCoalescedOptions)
        hosts = _hosts(tensors)
        work = self._gloo.allreduce_coalesced(hosts, opts)
        return self._averaged(work, hosts) if average else work

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        opts, average = self._reduce_options(opts or dist.ReduceOptions(), dist.ReduceOptions)
        hosts = _hosts(tensors)
        work = self._gloo.reduce(hosts, opts)
        return self._averaged(work, hosts if self.rank() == opts.rootRank else []) if average else work

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        return self._gloo.broadcast(_hosts(tensors), opts or dist.BroadcastOptions())

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts: Any = None) -> Any:
        if any(len({t.shape for t in group}) > 1 for group in output_tensors):
            return self._allgather_uneven(output_tensors, input_tensors, opts)
        outputs = [_hosts(group) for group in output_tensors]
        return _call(self._gloo.allgather, outputs, _hosts(input_tensors), opts=opts)

    def _allgather_uneven(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                          opts: Any) -> Any:
        """Outputs of different sizes (a rank's input fits its own slot): as HCCL, one broadcast from each rank."""
        (outputs,), (input,) = [_hosts(group) for group in output_tensors], _hosts(input_tensors)
        if len(outputs) != self.size():
            raise RuntimeError(f"all_gather needs one output tensor per rank ({self.size()}), got {len(outputs)}")
        outputs[self.rank()].copy_(input)
        works = []
        for root, output in enumerate(outputs):
            broadcast = dist.BroadcastOptions()
            broadcast.rootRank, broadcast.rootTensor = root, 0
            if opts is not None:
                broadcast.timeout = opts.timeout
            works.append(self._gloo.broadcast([output], broadcast))
        return _all_of(works)

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                            opts: Any = None) -> Any:
        outputs = [_hosts(group) for group in output_lists]
        return _call(self._gloo.allgather_coalesced, outputs, _hosts(inputs), opts=opts)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        _check_gather(output, input, self.size())
        return _call(self._gloo._allgather_base, _flat_host(output), _flat_host(input), opts=opts)

    _allgather_base = all_gather_single  # the name before torch 2.10

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None) -> Any:
        works = [self.all_gather_single(out, inp, opts) for out, inp in zip(outputs, inputs)]
        return _all_of(works)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                       opts: Any = None) -> Any:
        opts, average = self._reduce_options(opts or dist.ReduceScatterOptions(), dist.ReduceScatterOptions)
        outputs = _hosts(output_tensors)
        work = self._gloo.reduce_scatter(outputs, [_hosts(group) for group in input_tensors], opts)
        return self._averaged(work, outputs) if average else work

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        _check_scatter(output, input, self.size())
        opts, average = self._reduce_options(opts or dist.ReduceScatterOptions(), dist.ReduceScatterOptions)
        host_output = _flat_host(output)
        work = self._gloo._reduce_scatter_base(host_output, _flat_host(input), opts)
        return self._averaged(work, [host_output]) if average else work

    _reduce_scatter_base = reduce_scatter_single  # the name before torch 2.10

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> Any:
        works = [self.reduce_scatter_single(out, inp, opts) for out, inp in zip(outputs, inputs)]
        return _all_of(works)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                          input_split_sizes: list[int], opts: Any = None) -> Any:
        return self._gloo.alltoall_base(_host(output), _host(input), output_split_sizes, input_split_sizes,
                                        opts or dist.AllToAllOptions())

    alltoall_base = all_to_all_single  # the name before torch 2.10

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        return self._gloo.alltoall(_hosts(outputs), _hosts(inputs), opts or dist.AllToAllOptions())

    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts: Any = None) -> Any:
        outputs = [_hosts(group) for group in output_tensors]
        return self._gloo.gather(outputs, _hosts(input_tensors), opts or dist.GatherOptions())

    def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                opts: Any = None) -> Any:
        inputs = [_hosts(group) for group in input_tensors]
        return self._gloo.scatter(_hosts(output_tensors), inputs, opts or dist.ScatterOptions())

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Any:
        return self._gloo.send(_hosts(tensors), dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Any:
        return self._gloo.recv(_hosts(tensors), src, tag)

    def barrier(self, opts: Any = None) -> Any:
        return self._gloo.barrier(opts or dist.BarrierOptions())


def _all_of(works: list[Any]) -> Any:
    """One Work that completes when all of `works` have."""
    futures = torch.futures.collect_all([work.get_future() for work in works])
    return torch._C._distributed_c10d._create_work_from_future(futures)


class _BackendView:
    """The inner gloo group as torch's helpers see a backend, with HCCL's capabilities (no communicator splitting)."""

    supports_splitting = False
    supports_coalescing = False
    supports_time_estimate = False

    def __init__(self, gloo: Any) -> None:
        self._gloo = gloo

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gloo, name)


def _create(store: Any, rank: int, size: int, timeout: timedelta) -> EmulatedHCCL:
    _destroy_groups_at_exit()
    return EmulatedHCCL(store, rank, size, timeout)


_destroy_registered = False


def _destroy_groups_at_exit() -> None:
    """Destroy the process groups while the interpreter is still whole, if the program did not.

    gloo's worker threads can still hold finished work (with tensors and Python callbacks) when a program ends without
    `destroy_process_group()`; destroyed during interpreter finalization they abort the process ("terminate called
    without an active exception", torch issue 190489): seen here as a 2-card Fabric FSDP script that trained and then
    died with SIGABRT about one run in twenty. Lightning destroys its groups at exit for NCCL only. A rank that must
    end at once (liveness) leaves by os._exit, which runs no atexit handler.
    """
    global _destroy_registered
    if not _destroy_registered:
        _destroy_registered = True
        atexit.register(_destroy_if_initialized)


def _destroy_if_initialized() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _create_at_first_use(store: Any, rank: int, size: int, timeout: timedelta) -> EmulatedHCCL:
    """Import the emulated habana_frameworks HCCL module (the device, and its registration of "hccl"), then create."""
    importlib.import_module("habana_frameworks.torch.distributed.hccl")
    return _create(store, rank, size, timeout)


def register_for_first_use() -> None:
    """`init_process_group("hccl")` after `import torch` alone, as on a Gaudi, whose autoload imports HCCL; the device
    is loaded only when a group is created."""
    register(_create_at_first_use)


def register(create: Any = _create) -> None:
    """Make `init_process_group("hccl")` use the emulated HCCL, for the `hpu` device (registering again is harmless)."""
    dist.Backend.register_backend(BACKEND_NAME, create, devices=["hpu"])
    dist.Backend.default_device_backend_map["hpu"] = BACKEND_NAME
    _recorded_by_gloo()


def _recorded_by_gloo() -> None:
    """torch 2.15 attaches its flight recorder to each new group whose backends do not record themselves
    (distributed_c10d._maybe_attach_flight_recorder), which needs a C++ backend registered on the group, and the
    emulated HCCL is a ProcessGroup subclass ("ProcessGroup name not set" from init_process_group). Its collectives
    are gloo's, which records its own (torch lists gloo as self-recording): "hccl" joins that list."""
    self_recording = getattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    if isinstance(self_recording, set):
        self_recording.add(BACKEND_NAME)

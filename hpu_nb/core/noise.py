"""Warnings of hpu_nb's dependencies that carry no action for a user, kept out of the output where hpu_nb makes the
call (never with a process-wide filter).

- torch's `barrier(): using the device under current context ... specify device_id in init_process_group`: hpu_nb
  (through Lightning / DeepSpeed) creates the process group, not the user; ignored around the strategies' barrier,
  `deepspeed.initialize` and DeepSpeed's checkpoint saving and loading (ZeRO-3's own barriers).
- torch's "`torch.distributed.all_gather_into_tensor` / `reduce_scatter_tensor` is deprecated": DeepSpeed's comm
  backend calls the old names; once DeepSpeed's backend exists it is given the new ones (`all_gather_single`,
  `reduce_scatter_single`, the same operations), so the warning is never triggered.
- DeepSpeed's "You are using ZeRO with an untested optimizer, proceed with caution": Lightning allows any optimizer
  (`zero_allow_untested_optimizer`); the record is dropped from DeepSpeed's logger while `deepspeed.initialize` runs.
- torch's "FSDP.state_dict_type() and FSDP.set_state_dict_type() are being deprecated" and, for sharded state dicts,
  "Please use DTensor instead and we are deprecating ShardedTensor", and torch.distributed.checkpoint's
  "`load_state_dict` is deprecated" (torch 2.13, FutureWarnings): Lightning 2.6's FSDPStrategy makes every checkpoint's
  state dicts through that context and those tensors, and Fabric's loads them with that function, as hpu_nb's
  full-state-dict helper does; ignored around HPUFSDPStrategy's state-dict, optimizer-state and checkpoint-loading
  calls, so a run under `-W error::FutureWarning` (lightning-habana's pytest settings) still checkpoints.
- Lightning's all_gather goes through torch's deprecated `torch.distributed.nn.functional.all_gather` (a warning per
  call site): ignored around MemoryMonitor's gather of the ranks' memory (hpu_nb.notebook.memory_monitor).

C++ messages go straight to file descriptor 2, past Python's warnings; `native_stderr_without` catches that descriptor
for one call and writes back every line but the named ones:
- torch DDP's "Time stats are currently only collected for CPU and CUDA devices" (once per rank, in one of the first
  training steps: the HPU device has no DDP timer): the strategies' first training steps (`OnceNativeMessage`), and
  for Fabric, whose loop is the user's, the DDP module's first forwards (`quiet_first_forwards`).
- the profiler's kineto lines "USDT: ... profiler_start / profiler_stop" and "Warning: Optimizer.step#SGD.step
  (function operator())" (torch's profiler collection): around HPUProfiler's start / stop and the end of its recording.
- c10's "CPUAllocator.cpp: Memory block of unknown size was allocated before the profiling started" (with
  `profile_memory=True`, at the first free of a tensor made before the recording started; nothing the user can
  change): HPUProfiler's first training batches (`OnceNativeMessage`, from `run_training_batch`'s start to its stop).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import torch.distributed as dist
from typing_extensions import override

BARRIER_DEVICE = r"barrier\(\): using the device under current context"
UNTESTED_OPTIMIZER = "You are using ZeRO with an untested optimizer"
DEEPSPEED_LOGGER = "DeepSpeed"
DDP_TIME_STATS = r"Warning: Time stats are currently only collected for CPU and CUDA devices"
PROFILER_NATIVE = (
    r"^USDT:.*\] profiler_(start|stop)\s*$",
    r"collection\.cpp:\d+\] Warning: Optimizer\.step#\w+\.step ",
)
FSDP_STATE_DICTS = (r"FSDP\.state_dict_type\(\) and FSDP\.set_state_dict_type\(\) are being deprecated",
                    r"Please use DTensor instead and we are deprecating ShardedTensor",
                    r"`(load|save)_state_dict` is deprecated and will be removed in future versions")
CPU_ALLOCATOR_UNKNOWN_BLOCK = r"CPUAllocator\.cpp:\d+\] Memory block of unknown size was allocated before the profiling"


@contextmanager
def quiet_fsdp_state_dicts() -> Iterator[None]:
    """Around the FSDP strategy's state-dict calls (once or twice per checkpoint)."""
    with warnings.catch_warnings():
        for message in FSDP_STATE_DICTS:
            warnings.filterwarnings("ignore", message=message, category=FutureWarning)
        yield


@contextmanager
def quiet_barrier() -> Iterator[None]:
    """Around a barrier hpu_nb's strategy calls (a few per run: the warnings registry reset is harmless there)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=BARRIER_DEVICE, category=UserWarning)
        yield


class _DropMessages(logging.Filter):
    def __init__(self, *fragments: str) -> None:
        super().__init__()
        self.fragments = fragments

    @override
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(fragment in message for fragment in self.fragments)


@contextmanager
def without_log_messages(logger_name: str, *fragments: str) -> Iterator[None]:
    """Drop the records of one logger that contain one of `fragments`, for the duration of the block."""
    logger = logging.getLogger(logger_name)
    dropping = _DropMessages(*fragments)
    logger.addFilter(dropping)
    try:
        yield
    finally:
        logger.removeFilter(dropping)


@contextmanager
def quiet_deepspeed_initialize() -> Iterator[None]:
    """Around `deepspeed.initialize`: no "untested optimizer" record (Lightning lets every optimizer through), no
    barrier device warning (ZeRO-3 sets up its partitions with barriers of its own)."""
    with without_log_messages(DEEPSPEED_LOGGER, UNTESTED_OPTIMIZER), quiet_barrier():
        yield


def use_current_collective_names() -> bool:
    """Hand DeepSpeed's torch comm backend torch's current names for its two gathered / scattered collectives
    (`all_gather_single`, `reduce_scatter_single`) instead of the deprecated ones it picks. Returns True if changed."""
    try:
        from deepspeed.comm import comm as ds_comm  # noqa: PLC0415 -- lazy: deepspeed is optional
    except ImportError:
        return False
    backend = getattr(ds_comm, "cdb", None)
    changed = False
    for attribute, old, new in (("all_gather_function", "all_gather_into_tensor", "all_gather_single"),
                                ("reduce_scatter_function", "reduce_scatter_tensor", "reduce_scatter_single")):
        current = getattr(backend, attribute, None)
        if current is not None and current is getattr(dist, old, None) and hasattr(dist, new):
            setattr(backend, attribute, getattr(dist, new))
            changed = True
    return changed


@contextmanager
def native_stderr_without(*patterns: str) -> Iterator[list[str]]:
    """For the block, file descriptor 2 goes to a temporary file; afterwards its lines matching none of `patterns` are
    written to the real descriptor 2, in order. Yields the list the dropped lines are put in."""
    dropped: list[str] = []
    _flush_python_stderr()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield dropped
        finally:
            _flush_python_stderr()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept: list[str] = []
            for line in captured.read().decode(errors="replace").splitlines(keepends=True):
                (dropped if any(re.search(p, line) for p in patterns) else kept).append(line)
            if kept:
                os.write(2, "".join(kept).encode())


def _flush_python_stderr() -> None:
    with suppress(AttributeError, OSError, ValueError):
        sys.stderr.flush()


class OnceNativeMessage:
    """A C++ message printed once per process at an unknown one of the first calls (TORCH_WARN_ONCE): the first
    `max_calls` calls run under `native_stderr_without(pattern)` until the message was dropped, later ones as is."""

    def __init__(self, pattern: str, max_calls: int = 12) -> None:
        self.pattern, self.calls_left = pattern, max_calls

    @contextmanager
    def __call__(self) -> Iterator[None]:
        if self.calls_left <= 0:
            yield
            return
        self.calls_left -= 1
        with native_stderr_without(self.pattern) as dropped:
            yield
        if dropped:
            self.calls_left = 0


def quiet_first_forwards(module: Any, message: OnceNativeMessage) -> Any:
    """For a module whose forward the user's own loop calls (Fabric's DDP module): its first forwards run under
    `message` (the hooks go once it is spent). `always_call`: a forward that raises still gives the descriptor back."""
    entered: list[Any] = []

    def before(_module: Any, _args: Any) -> None:
        if message.calls_left > 0:
            block = message()
            block.__enter__()
            entered.append(block)

    def after(_module: Any, _args: Any, _output: Any) -> None:
        while entered:
            entered.pop().__exit__(None, None, None)
        if message.calls_left <= 0:
            for handle in handles:
                handle.remove()

    handles = [module.register_forward_pre_hook(before), module.register_forward_hook(after, always_call=True)]
    return module

"""Backward passes of the emulated card run on the calling thread, as the CPU's do.

torch's autograd engine hands a device's backward work to one worker thread per card, sized by the device guard's
``deviceCount()``. The emulated card computes on the CPU, so such threads only cost time (more than a small model's
whole backward) and, once started, make every forked child's backward fail ("bad fork"): notebooks fork workers for
``ddp_notebook`` and DeepSpeed after training in the same kernel. So the guard reports no device threads, and every
backward runs with autograd multithreading off (a per-thread setting), which sends the card's work to the calling
thread's CPU queue.

The engine is reached through ``Variable._execution_engine`` (torch/autograd/graph.py ``_engine_run_backward``,
for ``backward()`` and ``torch.autograd.grad``); ``tests/emulator/test_hpu_device.py`` fails if torch stops calling it
there.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.variable import Variable


class CallingThreadEngine:
    """torch's autograd engine, with each backward pass run on the thread that asked for it."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def run_backward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autograd.set_multithreading_enabled(False):
            return self._engine.run_backward(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # queue_callback, is_checkpoint_valid, ...
        return getattr(self._engine, name)


def install() -> None:
    """Route torch's backward passes through CallingThreadEngine (once per process)."""
    if not isinstance(Variable._execution_engine, CallingThreadEngine):
        Variable._execution_engine = CallingThreadEngine(Variable._execution_engine)

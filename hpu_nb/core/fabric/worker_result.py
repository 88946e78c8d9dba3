"""What a forked Fabric worker's function returns, carried to the launching process (a notebook's kernel) as bytes.

Lightning's Fabric launcher puts rank 0's return value on a multiprocessing queue as is: torch pickles its tensors as
shared-memory handles that the worker's resource sharer hands out, and the worker has exited by the time the kernel
reads them (`FileNotFoundError` in `resource_sharer.get_connection`): `fabric.launch(train)` returning a state dict
failed in a notebook. torch.save'd bytes carry the tensors themselves.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device


@dataclass
class WorkerResult:
    """A worker function's return value, serialised by torch.save (tensors on the CPU)."""

    payload: bytes

    def load(self) -> Any:
        # the value the user's own function returned in the user's own worker: not untrusted data
        return torch.load(io.BytesIO(self.payload), weights_only=False)


def returning_bytes(function: Callable[..., Any]) -> Callable[..., WorkerResult]:
    """`function`, returning its result as a WorkerResult."""
    def run(*args: Any, **kwargs: Any) -> WorkerResult:
        buffer = io.BytesIO()
        torch.save(move_data_to_device(function(*args, **kwargs), "cpu"), buffer)
        return WorkerResult(buffer.getvalue())

    return run


def unpack(result: Any) -> Any:
    """In the launching process: the worker's return value."""
    return result.load() if isinstance(result, WorkerResult) else result

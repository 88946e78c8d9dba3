"""transformer_engine.distributed, emulated: `activation_checkpointing`, what optimum-habana wraps recomputed
functions with so te layers know a forward is recomputed.

On the emulated Gaudi it marks the region (`in_activation_checkpointing()`); the layers compute the same values in a
recomputed forward (their scales change only at the start of a training step's first forward).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__emulated__ = True
__all__ = ["activation_checkpointing", "in_activation_checkpointing"]

_depth = 0


@contextlib.contextmanager
def activation_checkpointing() -> Iterator[None]:
    """A context manager, usable as a decorator (`activation_checkpointing()(fn)`), as optimum-habana uses it."""
    global _depth
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1


def in_activation_checkpointing() -> bool:
    return _depth > 0

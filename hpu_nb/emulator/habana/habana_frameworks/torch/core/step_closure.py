"""habana_frameworks.torch.core.step_closure, emulated: mark_step and the closures lazy mode runs after it.

The emulated card computes eagerly, so in lazy mode `mark_step()` only counts (`placed_mark_steps`) and runs the step
closures, as Habana's does after executing the graph; in eager mode it does nothing, as on a Gaudi.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from habana_frameworks.torch.utils.internal import is_lazy

placed_mark_steps = 0
_step_closures: list[Callable[[], Any]] = []


def add_step_closure(closure: Callable[..., Any], args: tuple = ()) -> None:
    """Run `closure(*args)` after the next mark_step (lazy mode only, as on a Gaudi)."""
    if is_lazy():
        _step_closures.append(lambda: closure(*args))


def _run_step_closures() -> None:
    closures = list(_step_closures)
    _step_closures.clear()
    for closure in closures:
        closure()


def mark_step(device_str: str = "", sync: bool = False) -> None:
    """End the accumulated lazy graph: a no-op in eager mode; counted in lazy mode (the emulation is eager)."""
    global placed_mark_steps
    if is_lazy():
        placed_mark_steps += 1
        _run_step_closures()


def iter_mark_step(device_str: str = "") -> None:
    mark_step(device_str)


def _mark_step_if_lazy(device_str: str = "") -> None:
    if is_lazy():
        mark_step(device_str)

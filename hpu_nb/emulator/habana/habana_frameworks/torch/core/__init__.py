"""habana_frameworks.torch.core, emulated: the execution mode and mark_step.

The emulated Gaudi always computes eagerly on the CPU. It still follows the mode Gaudi software would be in
(PT_HPU_LAZY_MODE: "0" eager, the default since 1.21; "1" lazy, legacy), so code that asks `is_lazy()` takes the
same branch as on a Gaudi; in lazy mode `mark_step()` is only counted (`placed_mark_steps`), never needed.
"""

from __future__ import annotations

from typing import Any

from habana_frameworks.torch import hpu  # noqa: F401  (htcore.hpu, as in Habana's core)
from habana_frameworks.torch.core import step_closure  # noqa: F401
from habana_frameworks.torch.core.step_closure import add_step_closure, iter_mark_step, mark_step  # noqa: F401
from habana_frameworks.torch.utils.internal import is_lazy  # noqa: F401

__emulated__ = True


def __getattr__(name: str) -> Any:
    if name == "placed_mark_steps":  # how many mark_step() calls lazy mode placed (kept in step_closure)
        return step_closure.placed_mark_steps
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def hpu_set_env() -> None:
    """Habana sets its quantization environment before Neural Compressor's convert; nothing to set here."""


def hpu_initialize(model: Any = None, mark_only_scales_as_const: bool = False, optimizer: Any = None,
                   args: Any = None) -> None:
    """Habana prepares a converted model for the graph compiler; the emulated Gaudi runs it as it is."""

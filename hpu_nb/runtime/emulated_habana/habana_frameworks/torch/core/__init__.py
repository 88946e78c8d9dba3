"""habana_frameworks.torch.core, emulated: the execution mode and mark_step.

The emulated Gaudi always computes eagerly on the CPU. It still follows the mode Gaudi software would be in
(PT_HPU_LAZY_MODE: "0" eager, the default since 1.21; "1" lazy, legacy), so code that asks `is_lazy()` takes the
same branch as on a Gaudi; in lazy mode `mark_step()` is only counted (`placed_mark_steps`), never needed.
"""

from __future__ import annotations

from typing import Any

import habana_frameworks.torch.hpu  # noqa: F401  (Habana's core needs the device; so does this one)

from hpu_nb.runtime.env import lazy_mode_from_env

__emulated__ = True
EMULATED_DEFAULT_LAZY = False  # today's Gaudi software (1.21+) runs eager + torch.compile unless told otherwise
placed_mark_steps = 0  # mark_step() calls made in lazy mode (where a Gaudi would run the accumulated graph)


def is_lazy() -> bool:
    """Whether Gaudi software would run in lazy mode here (PT_HPU_LAZY_MODE; eager when unset)."""
    return lazy_mode_from_env(EMULATED_DEFAULT_LAZY)


def mark_step(device_str: str = "", sync: bool = False) -> None:
    """End the accumulated lazy graph: a no-op in eager mode; counted in lazy mode (the emulation is eager)."""
    global placed_mark_steps
    if is_lazy():
        placed_mark_steps += 1


def hpu_set_env() -> None:
    """Habana sets its quantization environment before Neural Compressor's convert; nothing to set here."""


def hpu_initialize(model: Any = None, mark_only_scales_as_const: bool = False, optimizer: Any = None,
                   args: Any = None) -> None:
    """Habana prepares a converted model for the graph compiler; the emulated Gaudi runs it as it is."""

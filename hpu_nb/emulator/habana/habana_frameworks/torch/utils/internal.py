"""habana_frameworks.torch.utils.internal, emulated: the execution mode."""

from __future__ import annotations

from hpu_nb.runtime.env import lazy_mode_from_env

EMULATED_DEFAULT_LAZY = False  # today's Gaudi software (1.21+) runs eager + torch.compile unless told otherwise


def is_lazy() -> bool:
    """Whether Gaudi software would run in lazy mode here (PT_HPU_LAZY_MODE; eager when unset)."""
    return lazy_mode_from_env(EMULATED_DEFAULT_LAZY)

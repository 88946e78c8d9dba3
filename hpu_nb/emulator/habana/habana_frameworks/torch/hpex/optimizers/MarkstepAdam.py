"""habana_frameworks.torch.hpex.optimizers.MarkstepAdam, emulated: torch's Adam with mark_steps around the update,
as the bridge's copy of torch.optim.Adam does (a no-op in eager mode; counted in lazy mode)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from habana_frameworks.torch.core import step_closure

__emulated__ = True
__all__ = ["Adam"]


class Adam(torch.optim.Adam):
    """torch.optim.Adam, same arguments and update; lazy mode marks a step before and after the update."""

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        step_closure.mark_step()
        loss = super().step(closure)
        step_closure.mark_step()
        return loss

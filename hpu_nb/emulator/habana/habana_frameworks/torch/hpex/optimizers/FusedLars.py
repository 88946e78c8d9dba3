"""habana_frameworks.torch.hpex.optimizers.FusedLars, emulated: Habana's LARS wrapper on the emulated Gaudi.

Models the bridge's hpex/optimizers/FusedLars.py: it wraps another optimizer (usually FusedResourceApplyMomentum),
takes over its weight decay, turns each gradient into its layer-wise scaled step (trust ratio where `skip_mask` is
1, plain lr * g where it is 0: see `_kernels.lars`), lets the wrapped optimizer step, then gives the weight decay back.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from habana_frameworks.torch.core import step_closure
from habana_frameworks.torch.hpex.optimizers import _kernels
from torch.optim import Optimizer

__emulated__ = True


class FusedLars(Optimizer):
    """LARS (You et al., "Large Batch Training of Convolutional Networks") around `optimizer`."""

    def __init__(self, optimizer: Optimizer, skip_mask: Sequence[int], eeta: float = 0.001, eps: float = 1e-8) -> None:
        self.optim = optimizer
        self.eeta = eeta
        self.eps = eps
        self.skip_mask = skip_mask
        defaults = optimizer.defaults
        defaults.update(dict(skip_mask=skip_mask, eeta=eeta, eps=eps))
        super().__init__(optimizer.param_groups, defaults)
        self.state = self.optim.__getstate__()["state"]

    def zero_grad(self, set_to_none: bool = False) -> None:
        self.optim.zero_grad(set_to_none)

    def step(self) -> None:  # Habana's takes no closure
        weight_decays = []
        with torch.no_grad():
            for group in self.optim.param_groups:
                weight_decay = group.get("weight_decay", 0)
                weight_decays.append(weight_decay)
                group["weight_decay"] = 0
                params, grads, masks = [], [], []
                for idx, p in enumerate(group["params"]):
                    if p.grad is None:
                        continue
                    params.append(p.data)
                    grads.append(p.grad.data)
                    masks.append(self.skip_mask[idx])
                if params:
                    step_closure._mark_step_if_lazy()
                    _kernels.lars(params, grads, masks, self.eeta, weight_decay, self.eps,
                                  torch.tensor(group["lr"], device=params[0].device))
                    step_closure._mark_step_if_lazy()
        self.optim.step()
        for group, weight_decay in zip(self.optim.param_groups, weight_decays):
            group["weight_decay"] = weight_decay

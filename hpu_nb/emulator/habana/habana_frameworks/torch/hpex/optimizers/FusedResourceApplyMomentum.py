"""habana_frameworks.torch.hpex.optimizers.FusedResourceApplyMomentum, emulated, as the bridge's module of that name.

TensorFlow's ResourceApplyMomentum on already lr-scaled gradients (FusedLars makes them): buf = momentum * buf - d_p;
p += buf. Modelled as the bridge does it, first step included: there the buffer starts as a copy of d_p and d_p is
*added* to the parameter (the bridge's reference implementation in its tests does the same).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from habana_frameworks.torch.core import step_closure
from habana_frameworks.torch.hpex.optimizers import _kernels
from torch.optim.optimizer import Optimizer

__emulated__ = True


def resource_apply_momentum(params_momentum_buffer_list: list, d_p_list: list[torch.Tensor], *, momentum: float,
                            lr: float, nesterov: bool) -> None:
    """The interleaved [p0, buf0, p1, buf1, ...] list is updated in place; a None buffer means a first step."""
    if len(params_momentum_buffer_list) == 0:
        return
    if params_momentum_buffer_list[1] is None:
        for i, d_p in enumerate(d_p_list):
            param = params_momentum_buffer_list[2 * i]
            if momentum != 0:
                buf = torch.clone(d_p).detach()
                params_momentum_buffer_list[2 * i + 1] = buf
                d_p = buf
            param.add_(d_p)
    else:
        _kernels.resource_apply_momentum(params_momentum_buffer_list, d_p_list, momentum)


class FusedResourceApplyMomentum(Optimizer):
    """Momentum SGD in TensorFlow's form (lr is applied beforehand, by FusedLars)."""

    def __init__(self, params: object, lr: float, momentum: float = 0, weight_decay: float = 0,
                 nesterov: bool = False) -> None:
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and momentum <= 0:
            raise ValueError("Nesterov momentum requires a momentum")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov))

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("nesterov", False)

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            interleaved: list = []
            d_ps = []
            for p in group["params"]:
                if p.grad is not None:
                    interleaved.append(p)
                    d_ps.append(p.grad)
                    interleaved.append(self.state[p].get("momentum_buffer"))
            step_closure._mark_step_if_lazy()
            resource_apply_momentum(interleaved, d_ps, momentum=group["momentum"], lr=group["lr"],
                                    nesterov=group["nesterov"])
            step_closure._mark_step_if_lazy()
            for i in range(len(interleaved) // 2):
                self.state[interleaved[2 * i]]["momentum_buffer"] = interleaved[2 * i + 1]
        return loss

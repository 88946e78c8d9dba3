"""habana_frameworks.torch.hpex.optimizers.FusedSGD, emulated: Habana's fused SGD on the emulated Gaudi.

Models the bridge's hpex/optimizers/FusedSGD.py: `lr` required, its argument checks, momentum buffers allocated as
zeros, the learning rate read from the param group at every step (schedulers work), and the update of
torch.optim.SGD (weight decay, momentum, dampening, nesterov), which the bridge's own tests compare it with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from habana_frameworks.torch.core import step_closure
from habana_frameworks.torch.hpex.optimizers import _kernels
from torch.optim import Optimizer
from torch.optim.optimizer import required

__emulated__ = True


class FusedSGD(Optimizer):
    """SGD with optional momentum / nesterov, one fused update per param group (as Habana's)."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: Any = required, momentum: float = 0,
                 weight_decay: float = 0, dampening: float = 0, nesterov: bool = False) -> None:
        if lr is required:
            raise TypeError("FusedSGD.__init__() missing 1 required argument: 'lr'")
        if not lr >= 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not momentum >= 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if not weight_decay >= 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if not dampening >= 0.0:
            raise ValueError(f"Invalid dampening value: {dampening}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, dampening=dampening, nesterov=nesterov)
        super().__init__(params, defaults)
        step_closure._mark_step_if_lazy()

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            grads, weights, buffers = [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("SGD does not support sparse gradients, please consider SparseSGD")
                grads.append(p.grad)
                weights.append(p.data)
                if group["momentum"] != 0:
                    state = self.state[p]
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = torch.zeros(p.grad.shape, dtype=p.grad.dtype).to(p.device)
                    buffers.append(state["momentum_buffer"])
            step_closure._mark_step_if_lazy()
            lr = torch.tensor([group["lr"]], dtype=torch.float)
            _kernels.sgd(grads, weights, lr, group["weight_decay"], buffers if group["momentum"] != 0 else None,
                         group["momentum"], group["dampening"], group["nesterov"])
            step_closure._mark_step_if_lazy()
        return loss

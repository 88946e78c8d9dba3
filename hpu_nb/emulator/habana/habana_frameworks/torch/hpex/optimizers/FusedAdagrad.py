"""habana_frameworks.torch.hpex.optimizers.FusedAdagrad, emulated: Habana's fused Adagrad on the emulated Gaudi.

Models the bridge's hpex/optimizers/FusedAdagrad.py: its argument checks, the accumulator ("sum") filled with
`initial_accumulator_value` for every parameter at construction, the step counted per group, and torch.optim.Adagrad's
update (weight decay, lr decay, eps outside the square root).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from habana_frameworks.torch.core import step_closure
from habana_frameworks.torch.hpex.optimizers import _kernels
from torch.optim import Optimizer

__emulated__ = True


class FusedAdagrad(Optimizer):
    """Adagrad, one fused update per param group (as Habana's)."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float = 1e-2, lr_decay: float = 0,
                 weight_decay: float = 0, initial_accumulator_value: float = 0, eps: float = 1e-10) -> None:
        for name, value in (("learning rate", lr), ("lr_decay value", lr_decay), ("weight_decay value", weight_decay),
                            ("initial_accumulator_value value", initial_accumulator_value), ("epsilon value", eps)):
            if not value >= 0.0:
                raise ValueError(f"Invalid {name}: {value}")
        defaults = dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["sum"] = torch.full_like(p, fill_value=initial_accumulator_value)
            group["step_t"] = 0
        step_closure._mark_step_if_lazy()

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            step_closure._mark_step_if_lazy()
            grads, weights, sums = [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("Adagrad does not support sparse gradients, please consider SparseAdagrad")
                grads.append(p.grad)
                weights.append(p.data)
                sums.append(self.state[p]["sum"])
            group["step_t"] += 1
            _kernels.adagrad(grads, weights, sums, group["step_t"], group["lr"], group["weight_decay"],
                             group["lr_decay"], group["eps"])
        return loss

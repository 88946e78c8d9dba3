"""habana_frameworks.torch.hpex.optimizers.FusedLamb, emulated: Habana's fused LAMB on the emulated Gaudi.

Models the bridge's hpex/optimizers/FusedLamb.py and its three kernels: global gradient clipping to `max_grad_norm`
(None: none), Adam moments from the clipped gradient (`grad_averaging`), bias correction, decoupled weight decay added
to the update, and the trust ratio |w| / |update| (1 where either norm is 0, as Habana's reference LAMB: a
zero-initialised parameter moves) applied when weight decay is non-zero or `use_lamb`. AMSGrad is refused, as Habana's
is; `adam_w_mode` and `fused` are accepted and, as on a Gaudi, change nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from habana_frameworks.torch.core import step_closure
from habana_frameworks.torch.hpex.optimizers import _kernels
from torch.optim import Optimizer

__emulated__ = True


class FusedLamb(Optimizer):
    """LAMB (You et al., "Large Batch Optimization for Deep Learning"), as Habana fuses it."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float = 1e-3, bias_correction: bool = True,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.01,
                 amsgrad: bool = False, adam_w_mode: bool = True, grad_averaging: bool = True,
                 set_grad_none: bool = True, max_grad_norm: float | None = 1.0, use_lamb: bool = False,
                 fused: bool = False, dtype: torch.dtype | None = None) -> None:
        if amsgrad:
            raise RuntimeError("FusedLamb does not support the AMSGrad variant.")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps, weight_decay=weight_decay,
                        grad_averaging=grad_averaging, max_grad_norm=max_grad_norm)
        super().__init__(params, defaults)
        self.fused = fused
        self.adam_w_mode = 1 if adam_w_mode else 0
        self.set_grad_none = set_grad_none
        self.use_lamb = use_lamb
        self.device = self.param_groups[0]["params"][0].device
        self.dtype = dtype

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Grads become None when the optimizer was built with set_grad_none (its default), as Habana's."""
        if self.set_grad_none:
            for group in self.param_groups:
                for p in group["params"]:
                    p.grad = None
        else:
            super().zero_grad(set_to_none=False)

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        clip_divisor = self._clip_divisor()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            group["step"] = group.get("step", 0) + 1
            if group["bias_correction"]:
                bc1 = torch.tensor(1.0 - beta1 ** group["step"], device=self.device)
                bc2 = torch.tensor(1.0 - beta2 ** group["step"], device=self.device)
            else:
                bc1 = torch.tensor(1.0, device=self.device)
                bc2 = torch.tensor(1.0, device=self.device)
            grads, weights, exp_avgs, exp_avg_sqs = [], [], [], []
            step_closure._mark_step_if_lazy()
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if len(state) == 0:
                    state["exp_avg"] = torch.zeros(p.shape).to(self.device).to(p.dtype)
                    state["exp_avg_sq"] = torch.zeros(p.shape).to(self.device).to(p.dtype)
                grads.append(p.grad)
                weights.append(p.data)
                exp_avgs.append(state["exp_avg"])
                exp_avg_sqs.append(state["exp_avg_sq"])
            step_closure._mark_step_if_lazy()
            weight_norms, update_norms, updates = _kernels.lamb_phase1(
                grads, weights, exp_avgs, exp_avg_sqs, clip_divisor, bool(group["grad_averaging"]), beta1, beta2,
                group["eps"], bc1, bc2, group["weight_decay"])
            step_closure._mark_step_if_lazy()
            _kernels.lamb_phase2(weights, update_norms, weight_norms, updates,
                                 torch.tensor(-group["lr"], device=self.device), group["weight_decay"], self.use_lamb)
            step_closure._mark_step_if_lazy()
        return loss

    def _clip_divisor(self) -> torch.Tensor:
        max_grad_norm = self.defaults["max_grad_norm"]
        if max_grad_norm is None:
            return torch.tensor([1.0], dtype=torch.float32, device=self.device)
        grads = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("Lamb does not support sparse gradients, consider SparseAdam instead.")
                grads.append(p.grad if self.dtype is None else p.grad.to(dtype=self.dtype))
        return _kernels.lamb_fused_norm(grads, max_grad_norm)

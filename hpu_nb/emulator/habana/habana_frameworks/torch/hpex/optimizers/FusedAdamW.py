"""habana_frameworks.torch.hpex.optimizers.FusedAdamW, emulated: Habana's fused AdamW on the emulated Gaudi.

Models the bridge's hpex/optimizers/FusedAdamW.py: its arguments, checks and defaults (eps 1e-6, no amsgrad),
the step count kept per param group (group["step"]), `moments_dtype` (a dtype or a (exp_avg, exp_avg_sq) pair; fp8
moments carry a per-tensor scale in the state), and its kernel's maths (see `_kernels.adamw`: equal to
torch.optim.AdamW with the same arguments except that eps is added before the bias correction).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from habana_frameworks.torch.core import step_closure
from habana_frameworks.torch.hpex.optimizers import _kernels
from torch.optim import Optimizer

__emulated__ = True

MomentsDtype = torch.dtype | tuple[torch.dtype, torch.dtype] | None


class FusedAdamW(Optimizer):
    """AdamW with decoupled weight decay, one fused update per param group (as Habana's)."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.0,
                 bias_correction: bool = True, moments_dtype: MomentsDtype = None) -> None:
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr} - should be >= 0.0")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter: {betas[0]} - should be in [0.0, 1.0[")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter: {betas[1]} - should be in [0.0, 1.0[")
        if not eps >= 0.0:
            raise ValueError(f"Invalid epsilon value: {eps} - should be >= 0.0")
        if not weight_decay >= 0.0:  # as Habana's distributed FusedAdamW and MarkstepAdamW check it
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        _kernels.check_moments_dtype(moments_dtype)  # at construction, not at the first step()
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=bias_correction)
        super().__init__(params, defaults)
        self.moments_dtype = moments_dtype
        self.moments_in_fp8 = self.check_moments_in_fp8()

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        """One AdamW step for every param group (a mark_step before each group and after, in lazy mode)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            step_closure._mark_step_if_lazy()
            self._step_group(group)
        step_closure._mark_step_if_lazy()
        return loss

    def _step_group(self, group: dict) -> None:
        grads, weights, exp_avgs, exp_avg_sqs, avg_scales, sq_scales = [], [], [], [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("Adam does not support sparse gradients, please consider SparseAdam")
            state = self.state[p]
            if len(state) == 0:
                self._init_state(p, state)
            grads.append(p.grad)
            weights.append(p.data)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            if self.moments_in_fp8:
                avg_scales.append(state["exp_avg_scale"])
                sq_scales.append(state["exp_avg_sq_scale"])
        if not weights:
            return
        beta1, beta2 = group["betas"]
        group["step"] = group.get("step", 0) + 1
        step_size = group["lr"]
        if self.is_bias_correction(group):
            step_size = _kernels.bias_corrected_step(group["lr"], beta1, beta2, group["step"])
        # As the bridge: the step and the decay factor are one-element tensors in the weights' dtype.
        neg_step = torch.tensor([-step_size], dtype=torch.float).to(weights[0].dtype)
        modified_wd = 1.0 - group["weight_decay"] * group["lr"]
        modified_wd_t = torch.tensor([modified_wd], dtype=torch.float).to(weights[0].dtype)
        _kernels.adamw(grads, weights, exp_avgs, exp_avg_sqs, neg_step, beta1, beta2, group["eps"], modified_wd_t,
                       modified_wd != 1.0, avg_scales if self.moments_in_fp8 else None,
                       sq_scales if self.moments_in_fp8 else None)

    def _init_state(self, p: torch.Tensor, state: dict) -> None:
        state["step"] = 0  # the bridge keeps this 0: its count is group["step"]
        exp_avg_dtype, exp_avg_sq_dtype = self.get_moment_dtypes(p.dtype)
        state["exp_avg"] = torch.zeros(p.shape, dtype=exp_avg_dtype).to(p.device)
        state["exp_avg_sq"] = torch.zeros(p.shape, dtype=exp_avg_sq_dtype).to(p.device)
        if self.moments_in_fp8:
            state["exp_avg_scale"] = torch.tensor([1], dtype=p.dtype).to(p.device)
            state["exp_avg_sq_scale"] = torch.tensor([1], dtype=p.dtype).to(p.device)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch.optim's load, then the moments put back as this optimizer keeps them: torch casts every floating
        state tensor to its parameter's dtype, which turned fp8 moments into float32 still multiplied by their scale
        and bf16 ones into float32 (the resumed run then differed from the uninterrupted one). The saved tensors are
        used as they were saved; a state from another moments_dtype (or torch.optim.AdamW) is converted."""
        saved_ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        params = [p for group in self.param_groups for p in group["params"]]
        saved_state = state_dict["state"]
        super().load_state_dict(state_dict)
        for saved_id, p in zip(saved_ids, params):
            saved = saved_state.get(saved_id)
            if not saved or p not in self.state:
                continue
            state = self.state[p]
            for key, dtype in zip(("exp_avg", "exp_avg_sq"), self.get_moment_dtypes(p.dtype)):
                if key not in saved:
                    continue
                state[key], scale = _kernels.restore_moment(saved[key], saved.get(f"{key}_scale"), dtype, p)
                if scale is not None:
                    state[f"{key}_scale"] = scale
                elif self.moments_in_fp8:  # the kernel takes a scale per moment when either is fp8
                    state[f"{key}_scale"] = torch.ones(1, dtype=p.dtype).to(p.device)
                else:
                    state.pop(f"{key}_scale", None)

    def is_bias_correction(self, group: dict) -> bool:
        """group["bias_correction"]; old checkpoints say "correct_bias"; torch.optim.AdamW's groups mean True."""
        if "bias_correction" in group:
            return group["bias_correction"]
        if "correct_bias" in group:
            print("FusedAdamW: key 'bias_correction' not found. using 'correct_bias' instead")
            print("This might occur when loading old checkpoints.")
            return group["correct_bias"]
        return True

    def get_moment_dtypes(self, param_dtype: torch.dtype) -> tuple[torch.dtype, torch.dtype]:
        return _kernels.moment_dtypes(self.moments_dtype, param_dtype)

    def check_moments_in_fp8(self) -> bool:
        return _kernels.moments_in_fp8(self.moments_dtype)

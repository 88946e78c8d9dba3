"""habana_frameworks.torch.hpex.optimizers.distributed.FusedAdamW, emulated: the functional FusedAdamW.

Models the bridge's module of that name, Habana's version of torch.distributed.optim's functional AdamW (what DDP's
optimizer-in-backward and ZeroRedundancyOptimizer drive): one param group, gradients handed to `step(gradients)`,
`step_param` refused, no amsgrad / maximize, eps 1e-6 and weight decay 0 by default; the update is the fused AdamW
kernel's (see `_kernels.adamw`), with the step count of the first parameter, as the bridge takes it.
"""

from __future__ import annotations

import torch
from habana_frameworks.torch.hpex.optimizers import _kernels
from habana_frameworks.torch.hpex.optimizers.FusedAdamW import MomentsDtype
from torch import Tensor

__emulated__ = True


class FusedAdamW:
    """Functional AdamW over a fixed list of parameters."""

    def __init__(self, params: list[Tensor], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0, _allow_empty_param_list: bool = False,
                 moments_dtype: MomentsDtype = None) -> None:
        if not lr >= 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not eps >= 0.0:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if not weight_decay >= 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if len(params) == 0 and not _allow_empty_param_list:
            raise ValueError("optimizer got an empty parameter list")
        _kernels.check_moments_dtype(moments_dtype)  # as FusedAdamW: at construction, not at the first step
        self.defaults = {"lr": lr, "eps": eps, "beta1": betas[0], "beta2": betas[1], "weight_decay": weight_decay}
        self.amsgrad = False
        self.maximize = False
        self.state: dict[Tensor, dict[str, Tensor]] = {}
        self.param_group = {"params": params}
        self.moments_dtype = moments_dtype
        self.moments_in_fp8 = self.check_moments_in_fp8()

    def step_param(self, param: Tensor, grad: Tensor | None) -> None:
        raise RuntimeError("This AdamW optimizer does not support step_param() as of now")

    def step(self, gradients: list[Tensor | None]) -> None:
        params = self.param_group["params"]
        if len(params) != len(gradients):
            raise ValueError("the gradients passed in does not equal to the size of the parameters!"
                             f"Params length: {len(params)}. Gradients length: {len(gradients)}")
        weights, grads, exp_avgs, exp_avg_sqs, avg_scales, sq_scales, steps = [], [], [], [], [], [], []
        for param, grad in zip(params, gradients):
            if grad is None:
                continue
            state = self.state.get(param)
            if state is None:
                state = self.state[param] = self._new_state(param)
            state["step"] += 1
            weights.append(param)
            grads.append(grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            if self.moments_in_fp8:
                avg_scales.append(state["exp_avg_scale"])
                sq_scales.append(state["exp_avg_sq_scale"])
            steps.append(int(state["step"].item()))
        if not weights:
            return
        d = self.defaults
        step_size = _kernels.bias_corrected_step(d["lr"], d["beta1"], d["beta2"], steps[0])
        modified_wd = 1.0 - d["weight_decay"] * d["lr"]
        with torch.no_grad():
            _kernels.adamw(grads, [w.data for w in weights], exp_avgs, exp_avg_sqs,
                           torch.tensor([-step_size], dtype=torch.float), d["beta1"], d["beta2"], d["eps"],
                           torch.tensor([modified_wd], dtype=torch.float), modified_wd != 1.0,
                           avg_scales if self.moments_in_fp8 else None, sq_scales if self.moments_in_fp8 else None)

    def _new_state(self, param: Tensor) -> dict[str, Tensor]:
        exp_avg_dtype, exp_avg_sq_dtype = self.get_moment_dtypes(param.dtype)
        state = {"step": torch.tensor(0.0),
                 "exp_avg": torch.zeros_like(param, dtype=exp_avg_dtype, memory_format=torch.preserve_format),
                 "exp_avg_sq": torch.zeros_like(param, dtype=exp_avg_sq_dtype, memory_format=torch.preserve_format)}
        if self.moments_in_fp8:
            state["exp_avg_scale"] = torch.tensor([1], dtype=param.dtype).to(param.device)
            state["exp_avg_sq_scale"] = torch.tensor([1], dtype=param.dtype).to(param.device)
        return state

    def get_moment_dtypes(self, param_dtype: torch.dtype) -> tuple[torch.dtype, torch.dtype]:
        return _kernels.moment_dtypes(self.moments_dtype, param_dtype)

    def check_moments_in_fp8(self) -> bool:
        return _kernels.moments_in_fp8(self.moments_dtype)

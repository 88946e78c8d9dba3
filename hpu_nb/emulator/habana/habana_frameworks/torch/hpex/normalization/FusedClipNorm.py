"""habana_frameworks.torch.hpex.normalization.FusedClipNorm, emulated: Gaudi's fused gradient-norm clipping.

Modelled on the bridge's hpex/normalization/FusedClipNorm.py and its fused_clip_norm op (release 1.19), as
optimum-habana's GaudiTrainer uses it (`FusedClipNorm(model.parameters(), max_grad_norm)`, then
`clip_norm(model.parameters())` after backward): the total 2-norm of all gradients is returned (a 1-element tensor on
the device, in the dtype of the first parameter given to the constructor; a CPU `tensor(0.0)` when no parameter has a
gradient), and every gradient is scaled in place by min(1, max_norm / (total_norm + 1e-6)), as
`torch.nn.utils.clip_grad_norm_`. Only the 2-norm exists (another `norm_type` is refused, as the Gaudi op does);
in lazy mode `mark_step` is called before and after, as Habana does. Computed in float32 on the emulated Gaudi.
"""

from __future__ import annotations

from collections.abc import Iterable

import habana_frameworks.torch.core as htcore
import torch

__emulated__ = True

CLIP_EPS = 1e-6  # the Gaudi op's: clip_coef = max_norm / (total_norm + 1e-6)


class FusedClipNorm:
    """Clip gradients by their total 2-norm (see the module docstring)."""

    def __init__(self, parameters: Iterable[torch.nn.parameter.Parameter], max_norm: float) -> None:
        params = list(parameters)
        self.dtype = params[0].dtype if params else torch.float32
        self.max_norm_t = (torch.ones(1) * max_norm).to(self.dtype).to(torch.device("hpu"))
        self.norm_type = 2.0

    def clip_norm(self, parameters: torch.Tensor | Iterable[torch.Tensor]) -> torch.Tensor:
        """Scale the gradients in place so their total 2-norm is at most max_norm; return the norm before clipping."""
        htcore.step_closure._mark_step_if_lazy()
        if isinstance(parameters, torch.Tensor):
            parameters = [parameters]
        grads = [p.grad for p in parameters if p.grad is not None]
        if not grads:
            return torch.tensor(0.0)
        if self.norm_type != 2:
            raise RuntimeError("unsupported norm_type for FusedClipNorm")
        with torch.no_grad(), torch.autocast("hpu", enabled=False):
            total_norm = torch.stack([g.detach().float().pow(2).sum() for g in grads]).sum().sqrt()
            clip_coef = (self.max_norm_t.float() / (total_norm + CLIP_EPS)).clamp(max=1.0).reshape(())
            for grad in grads:
                grad.mul_(clip_coef.to(grad.dtype))
            result = total_norm.reshape(1).to(self.dtype)
        htcore.step_closure._mark_step_if_lazy()
        return result

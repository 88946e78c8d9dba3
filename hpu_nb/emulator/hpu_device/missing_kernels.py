"""ATen ops Habana's bridge has no HPU kernel for: the emulated `hpu` device refuses them, as a Gaudi's dispatcher does.

The emulated device runs every ATen op through a boxed CPU fallback (hpu_device.cpp), so an op with a CPU kernel
works on emulated `hpu` tensors even where a Gaudi has none; code that passes here must work there. For the ops in
`OPS_WITHOUT_HPU_KERNEL` an HPU kernel registered from Python (it takes precedence over the fallback) raises
NotImplementedError naming the op and the 'HPU' backend, as the dispatcher does when no kernel is registered for a
backend. CPU tensors are unaffected.

Evidence, from Habana's gaudi-pytorch-bridge: `scripts/ops_list/ops_table_filtered.csv` lists
`aten::_amp_foreach_non_finite_check_and_unscale` and `aten::_amp_update_scale` with HPU = NO (CPU = NO, GPU = YES),
`scripts/ops_stats_data/exclude_ops.csv` excludes them as "GPU backend specific", and no yaml / cpp of the bridge
registers them. torch.amp.GradScaler calls both, so it fails on a Gaudi: hpu_nb.core.mixed_precision.HPUGradScaler
does the same work with plain tensor ops.
"""

from __future__ import annotations

from typing import NoReturn

import torch

__emulated__ = True
__all__ = ["OPS_WITHOUT_HPU_KERNEL", "register"]

# every overload of each op the bridge's op table marks HPU = NO; add ops here (overload-qualified ATen names)
OPS_WITHOUT_HPU_KERNEL: tuple[str, ...] = (
    "_amp_foreach_non_finite_check_and_unscale_",
    "_amp_foreach_non_finite_check_and_unscale",
    "_amp_foreach_non_finite_check_and_unscale.out",
    "_amp_update_scale_",
    "_amp_update_scale",
    "_amp_update_scale.out",
)

# what the emulated card offers instead, per op family (said in the error)
_INSTEAD = {
    "_amp_": "use hpu_nb.HPUGradScaler (plain tensor ops) instead of torch.amp.GradScaler on HPU",
}

_library: torch.library.Library | None = None


def _refusal(op: str) -> object:
    """A kernel that raises the dispatcher's NotImplementedError for `op` on the HPU backend."""
    hint = next((text for prefix, text in _INSTEAD.items() if op.startswith(prefix)), None)

    def refuse(*args: object, **kwargs: object) -> NoReturn:
        message = (
            f"Could not run 'aten::{op.split('.')[0]}' with arguments from the 'HPU' backend: Habana's bridge has no"
            " HPU kernel for this operator (emulated Gaudi: refused as on a Gaudi)."
        )
        raise NotImplementedError(message + (f" Hint: {hint}." if hint else ""))

    return refuse


def register() -> None:
    """Register the refusals at the HPU dispatch key (once per process; after the device's own kernels)."""
    global _library
    if _library is not None:
        return
    lib = torch.library.Library("aten", "IMPL")
    for op in OPS_WITHOUT_HPU_KERNEL:
        lib.impl(op, _refusal(op), "HPU")
    _library = lib

"""habana_frameworks.torch.core, emulated: the execution mode and mark_step.

The emulated Gaudi always computes eagerly on the CPU. It still follows the mode Gaudi software would be in
(PT_HPU_LAZY_MODE: "0" eager, the default since 1.21; "1" lazy, legacy), so code that asks `is_lazy()` takes the
same branch as on a Gaudi; in lazy mode `mark_step()` is only counted (`placed_mark_steps`), never needed.
"""

from __future__ import annotations

from typing import Any

from habana_frameworks.torch import hpu  # noqa: F401  (htcore.hpu, as in Habana's core)
from habana_frameworks.torch.core import step_closure
from habana_frameworks.torch.core.step_closure import add_step_closure, iter_mark_step, mark_step  # noqa: F401
from habana_frameworks.torch.utils.internal import is_lazy  # noqa: F401

__emulated__ = True


def __getattr__(name: str) -> Any:
    if name == "placed_mark_steps":  # how many mark_step() calls lazy mode placed (kept in step_closure)
        return step_closure.placed_mark_steps
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- inference set-up (the bridge's core/quantization.py). On a Gaudi these switch the graph compiler's inference
# mode, fuse conv+bn and mark weights as constants (lazy mode); the emulated card runs the model as it is, so they
# only keep Habana's signatures and return values. --


def hpu_set_inference_env(model: Any = None) -> Any:
    """Before the model goes to the device: Habana returns the (conv+bn fused) model when given one, else None; the
    emulated Gaudi returns the model itself (unfused: in eval mode the same numbers)."""
    return model


def hpu_set_env(model: Any = None) -> Any:
    """Habana's older name of hpu_set_inference_env (to be deprecated there)."""
    return hpu_set_inference_env(model)


def hpu_inference_initialize(model: Any = None, mark_only_scales_as_const: bool = False, optimizer: Any = None,
                             args: Any = None, mark_non_scales: bool = True) -> None:
    """After model.to("hpu"): Habana marks its weights as constants for the graph compiler; nothing to do here.

    `mark_non_scales` is taken as newer releases take it (optimum-habana's pt2e example passes it)."""


def hpu_initialize(model: Any = None, mark_only_scales_as_const: bool = False, optimizer: Any = None,
                   args: Any = None) -> None:
    """Habana's older name of hpu_inference_initialize (to be deprecated there)."""
    hpu_inference_initialize(model, mark_only_scales_as_const, optimizer, args)


def hpu_teardown_inference_env() -> None:
    """Leave inference mode (nothing was switched on the emulated Gaudi)."""


def hpu_reset_env() -> None:
    """Habana's older name of hpu_teardown_inference_env."""
    hpu_teardown_inference_env()

"""The rules of a DeepSpeed configuration on HPU, written once: raised / warned by HPUDeepSpeedStrategy, shown by the
configuration widget (`deepspeed_issues`). DeepSpeed is optional (`pip install 'hpu_nb[deepspeed]'`) and only imported
when a strategy is created or its accelerator is asked.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from hpu_nb.core.issues import Issue
from hpu_nb.runtime import distributed as hpu_dist
from hpu_nb.runtime.base import DeviceBackend
from hpu_nb.runtime.generations import zero3_support

__all__ = [
    "EXTRA_HINT", "NOT_INSTALLED", "OPTIMIZER_OFFLOAD_STAGES", "ZERO_STAGES", "apply_issues", "deepspeed_issues",
    "inference_keys", "require_deepspeed", "validate_zero_config",
]

EXTRA_HINT = "pip install 'hpu_nb[deepspeed]'"
ZERO_STAGES = (0, 1, 2, 3)
OPTIMIZER_OFFLOAD_STAGES = (1, 2, 3)  # the ZeRO stages that can step the optimizer on the CPU (ZeRO-Offload)

NOT_INSTALLED = (f"DeepSpeed is not installed, and HPUDeepSpeedStrategy needs it. Install the extra: `{EXTRA_HINT}` (on"
                 " a Gaudi, install Habana's DeepSpeed fork instead, as Intel's Gaudi docs describe).")


def require_deepspeed() -> None:
    """Set DeepSpeed's environment for this device and check it is installed (clear error naming the extra)."""
    hpu_dist.prepare_deepspeed_environment()
    try:
        import deepspeed  # noqa: F401, PLC0415 -- lazy: deepspeed is optional
    except ImportError:
        raise MisconfigurationException(NOT_INSTALLED) from None


# -- the rules of a DeepSpeed configuration: written once, raised / warned by the strategy, shown by the widget -------
def deepspeed_issues(
    *,
    stage: Any = 2,
    zero_optimization: bool = True,
    offload_optimizer: bool = False,
    offload_parameters: bool = False,
    fp8_inference: bool = False,
    precision: str | None = None,
    backend: DeviceBackend | None = None,
    check_installed: bool = False,
) -> list[Issue]:
    """What is wrong with these DeepSpeed settings; each issue names the argument it concerns.

    `fp8_inference`: fp8 measure / quantize will run on the model. `precision`: the Trainer's, checked against
    DeepSpeed's accelerator (imports DeepSpeed). `backend`: check the Gaudi software release's rules for it.
    `check_installed`: say so when DeepSpeed is missing (without importing it).
    """
    issues: list[Issue] = []
    if check_installed and importlib.util.find_spec("deepspeed") is None:
        issues.append(Issue("deepspeed", NOT_INSTALLED))
        precision = None  # what DeepSpeed's accelerator supports cannot be asked
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        return [*issues, Issue("stage", f"DeepSpeed ZeRO stage {stage!r} does not exist: DeepSpeed ZeRO has stages 0,"
                                        " 1, 2 and 3 (e.g. HPUDeepSpeedStrategy(stage=2)).")]
    zero_stage = stage if zero_optimization else 0
    off = ", zero_optimization=False" if not zero_optimization else ""
    if offload_parameters and zero_stage != 3:
        issues.append(Issue("offload_parameters", (
            f"Offloading parameters with offload_parameters=True needs ZeRO stage 3, but stage is {stage}{off}. Use"
            " stage=3, or offload only the optimizer (offload_optimizer=True) with stage 1 or 2 (in a DeepSpeed"
            " config: 'offload_param' needs 'stage': 3).")))
    if offload_optimizer and zero_stage not in OPTIMIZER_OFFLOAD_STAGES:  # lightning-habana ignored it: so do we
        issues.append(Issue("offload_optimizer", (
            f"offload_optimizer=True is ignored: offloading the optimizer needs ZeRO stage 1, 2 or 3, but stage is "
            f"{stage}{off}: the optimizer stays on the device (so does a DeepSpeed config's 'offload_optimizer')."),
            "warning"))
    if fp8_inference and zero_stage == 3:  # fp8 inference reads and quantizes whole weights
        issues.append(Issue("stage", (
            "fp8 inference (measure or quantize) with DeepSpeed needs whole weights on each device, and ZeRO stage 3"
            " partitions them. Predict / test with ZeRO-0, 1 or 2 (e.g. HPUDeepSpeedStrategy(stage=2)): the stage"
            " only matters for training, and only ZeRO-3 partitions them.")))
    if backend is not None and zero_stage == 3:
        ok, reason = zero3_support(backend.generation(), backend.release())
        if not ok:
            issues.append(Issue("stage", reason, "warning"))
    if precision == "16-mixed":
        accelerator = _deepspeed_accelerator()
        if not accelerator.is_fp16_supported():
            issues.append(Issue("precision", (
                f"16-mixed with DeepSpeed: this DeepSpeed's accelerator has no fp16 (DeepSpeed's"
                f" {accelerator._name!r} accelerator); choose bf16-mixed.")))
    return issues


@functools.lru_cache(maxsize=1)
def _deepspeed_accelerator() -> Any:
    """DeepSpeed's accelerator, set up for this device (imports DeepSpeed once, only when its precision is asked)."""
    require_deepspeed()
    from deepspeed.accelerator import get_accelerator  # noqa: PLC0415 -- lazy: deepspeed is optional

    return get_accelerator()


def apply_issues(issues: list[Issue]) -> list[Issue]:
    """Raise the first error as MisconfigurationException, warn each warning; returns the warnings."""
    for issue in issues:
        if issue.is_error:
            raise MisconfigurationException(issue.message)
    for issue in issues:
        rank_zero_warn(issue.message)
    return issues


def inference_keys() -> set[str]:
    """The arguments `deepspeed.init_inference` takes (its config's fields)."""
    import deepspeed  # noqa: PLC0415 -- lazy: deepspeed is optional

    return set(deepspeed.default_inference_config())


def validate_zero_config(config: dict[str, Any], backend: DeviceBackend | None = None) -> None:
    """Catch the configurations DeepSpeed would reject late or obscurely (unknown stage, misplaced offload), by
    `deepspeed_issues`; an optimizer offload at stage 0 is dropped, saying so. `backend`: its release's rules too."""
    zero = config.get("zero_optimization")
    if zero is None or zero is False:
        return
    if not isinstance(zero, dict):
        raise MisconfigurationException(f"DeepSpeed config 'zero_optimization' must be a dict, got {zero!r}.")
    warned = apply_issues(deepspeed_issues(
        stage=zero.get("stage", 0), offload_parameters=bool(zero.get("offload_param")),
        offload_optimizer=bool(zero.get("offload_optimizer")), backend=backend))
    if any(issue.field == "offload_optimizer" for issue in warned):
        zero.pop("offload_optimizer")

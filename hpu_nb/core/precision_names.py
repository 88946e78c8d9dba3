"""The precision names every HPU precision plugin reads: aliases, the float dtype of each, and the generation check.

A leaf of the core package (of core it imports only the rule validators): HPUPrecision / HPUPrecisionPlugin, the
DeepSpeed and FSDP plugins, the fp8 conversion and the configuration widget all read their rules from here.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.fabric.utilities.rank_zero import rank_zero_warn

from hpu_nb.core.precision_rules import generation_issues
from hpu_nb.runtime import get_backend

__all__ = [
    "AUTOCAST_PRECISIONS",
    "LIGHTNING_HABANA_PRECISIONS",
    "PLUGIN_PRECISIONS",
    "PRECISION_ALIASES",
    "PRECISION_CHOICES",
    "PRECISION_DTYPES",
    "UnsupportedPrecisionError",
    "autocast_dtype",
    "precision_dtype",
    "unify_precision",
    "validate_precision",
]

# What users may write -> Lightning's unified name: the one table for every HPU precision plugin. "16" is Lightning's
# shorthand for "16-mixed", with a warning (HMP meant bfloat16 by it): see validate_precision.
PRECISION_ALIASES = {
    "32-true": "32-true",
    "32": "32-true",
    "bf16-mixed": "bf16-mixed",
    "bf16": "bf16-mixed",
    "16-mixed": "16-mixed",
    "16": "16-mixed",
    "fp8": "fp8",
    "bf16-true": "bf16-true",
    "16-true": "16-true",
}
PLUGIN_PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "fp8")  # what HPUPrecisionPlugin / HPUPrecision run
# lightning-habana's names, in its order (its `_PRECISION_INPUT`): its error listed them so, and its users' tests
# match that message
LIGHTNING_HABANA_PRECISIONS = ("32", "32-true", "bf16", "bf16-mixed", "fp8", "16-mixed")
# the plugin precisions that compute under torch.autocast (HPUPrecisionPlugin's op lists act on these)
AUTOCAST_PRECISIONS = tuple(name for name in PLUGIN_PRECISIONS if name.endswith("-mixed"))
PRECISION_CHOICES = tuple(
    alias for alias, name in PRECISION_ALIASES.items() if name in PLUGIN_PRECISIONS and alias != "16"
)

# The float dtype of each unified precision: what "-true" casts the weights to, what "-mixed" computes in under
# autocast (FSDP also reduces in it). fp8 runs its fp8 layers in fp8 and the rest in float32, as lightning-habana did
# (the transformer engine's fp8_autocast only); bf16 autocast around it is opt-in:
# HPUPrecisionPlugin("fp8", bf16_autocast=True).
PRECISION_DTYPES: dict[str, torch.dtype] = {
    "32-true": torch.float32,
    "bf16-mixed": torch.bfloat16,
    "bf16-true": torch.bfloat16,
    "16-mixed": torch.float16,
    "16-true": torch.float16,
    "fp8": torch.float32,
}


def unify_precision(precision: Any) -> str | None:
    """Lightning's unified name for what a user wrote ("bf16" -> "bf16-mixed", 32 -> "32-true"), or None."""
    if isinstance(precision, bool) or not isinstance(precision, (str, int)):
        return None
    return PRECISION_ALIASES.get(str(precision).strip())


def precision_dtype(precision: str) -> torch.dtype:
    """The float dtype of a unified precision name (float32 for "32-true")."""
    return PRECISION_DTYPES[precision]


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of a unified precision name (None where nothing runs under torch.autocast: "32-true",
    "-true", and "fp8", whose fp8 layers run under the transformer engine's fp8_autocast and the rest in float32)."""
    return PRECISION_DTYPES[precision] if precision.endswith("-mixed") else None


class UnsupportedPrecisionError(ValueError):
    """This precision cannot run on this Gaudi generation (fp16 / fp8 on first-generation Gaudi)."""


def validate_precision(precision: Any, *, check_device: bool = True) -> str:
    """Lightning's unified precision name for `precision`, or a ValueError listing the choices.

    With `check_device`, "16-mixed" and "fp8" raise UnsupportedPrecisionError on a first-generation Gaudi.
    """
    text = str(precision).strip() if isinstance(precision, (str, int)) and not isinstance(precision, bool) else None
    if text == "16":  # what Trainer(precision=16) means too: Lightning's historical shorthand for "16-mixed"
        rank_zero_warn(
            f"precision={precision!r} means '16-mixed' (float16), as in Lightning; Habana's HMP meant bfloat16 by 16:"
            " for that, use 'bf16-mixed'."
        )
    unified = unify_precision(precision)
    if unified not in PLUGIN_PRECISIONS:
        raise ValueError(  # lightning-habana's words first
            f"`Trainer(accelerator='hpu', precision={precision!r})` is not supported. `precision` must be one of:"
            f" {LIGHTNING_HABANA_PRECISIONS}. HPUPrecisionPlugin(precision={precision!r}) is not supported. Choose"
            f" one of: {', '.join(PRECISION_CHOICES)}."
        )
    if check_device:
        for issue in generation_issues(unified, get_backend()):  # the one owner of the generation rule
            raise UnsupportedPrecisionError(issue.message)
    return unified

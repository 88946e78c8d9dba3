"""The precision rules that do not belong to one strategy: what the Gaudi generation runs, and where fp8 inference runs.

Written once, as validators returning issues (hpu_nb.core.issues): the plugins raise with their messages, the config
widget shows them. The generation facts themselves (fp16 / fp8 from Gaudi2 on) live in hpu_nb.runtime.generations; a
strategy's own precision rules live with it (fp8 not with FSDP: strategy_parts/fsdp.py; fp8 inference not on ZeRO-3:
strategies/deepspeed_config.py).
"""

from __future__ import annotations

from hpu_nb.core.issues import Issue
from hpu_nb.runtime.base import DeviceBackend

__all__ = ["QUANTIZE_STRATEGIES", "fp8_quantize_issues", "generation_feature", "generation_issues"]

# Quantized fp8 inference runs in one process: these strategies keep one (DeepSpeed quantizes after wrapping the model)
QUANTIZE_STRATEGIES = ("auto", "single", "deepspeed")


def generation_feature(precision: str) -> str | None:
    """What a precision needs of the Gaudi generation: "fp16" ("16-mixed", "16-true"), "fp8", or None (any Gaudi).
    `precision` is Lightning's unified name, or "fp8"; the generations that have each are runtime.generations'."""
    if precision.startswith("16-"):
        return "fp16"
    return "fp8" if precision == "fp8" else None


def generation_issues(precision: str, backend: DeviceBackend) -> list[Issue]:
    """fp16 ("16-mixed", "16-true") and fp8 need Gaudi2 or newer: the generation's own reason, and what to use instead.
    `precision` is Lightning's unified name, or "fp8"."""
    feature = generation_feature(precision)
    if feature == "fp16":
        ok, reason = backend.fp16_support()
        hint = " Use precision='bf16-mixed' instead."
    elif feature == "fp8":
        ok, reason = backend.fp8_support()
        hint = ""
    else:
        return []
    return [] if ok else [Issue("precision", f"precision={precision!r} cannot run here: {reason}{hint}")]


def fp8_quantize_issues(strategy: str, devices: int) -> list[Issue]:
    """Quantized fp8 inference runs on one device. `strategy`: "auto", "single", "ddp", "deepspeed", "fsdp", ..."""
    if strategy in QUANTIZE_STRATEGIES and devices == 1:
        return []
    return [Issue("precision", (
        "quantized fp8 inference runs on one device: DDP would broadcast the fp8 weights, which its collectives cannot"
        " carry. Choose 1 device and strategy auto, single or DeepSpeed."))]

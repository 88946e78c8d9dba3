"""fp8 formats and the delayed-scaling recipe, shaped like Habana's transformer_engine.recipe."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch


class Format(enum.Enum):
    """fp8 formats: E4M3 everywhere, E5M2 everywhere, or HYBRID (E4M3 forward, E5M2 for gradients)."""

    E4M3 = "E4M3"
    E5M2 = "E5M2"
    HYBRID = "HYBRID"

    @property
    def forward_dtype(self) -> torch.dtype:
        return torch.float8_e5m2 if self is Format.E5M2 else torch.float8_e4m3fn

    @property
    def backward_dtype(self) -> torch.dtype:
        return torch.float8_e4m3fn if self is Format.E4M3 else torch.float8_e5m2


AMAX_ALGOS = ("max", "most_recent")


@dataclass
class DelayedScaling:
    """Scale each fp8 tensor by fp8_max / amax, the amax taken from the last `amax_history_len` steps.

    margin: scale down by 2**margin for headroom; interval: recompute scales every `interval` steps.
    """

    margin: int = 0
    interval: int = 1
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"

    def __post_init__(self) -> None:
        if isinstance(self.fp8_format, str):
            try:
                self.fp8_format = Format[self.fp8_format.upper()]
            except KeyError:
                raise ValueError(f"fp8_format={self.fp8_format!r}; choose one of {[f.name for f in Format]}.") from None
        if self.amax_compute_algo not in AMAX_ALGOS:
            raise ValueError(f"amax_compute_algo={self.amax_compute_algo!r}; choose one of {AMAX_ALGOS}.")
        if self.amax_history_len < 1 or self.interval < 1 or self.margin < 0:
            raise ValueError(
                f"DelayedScaling needs amax_history_len >= 1, interval >= 1, margin >= 0; got {self.amax_history_len},"
                f" {self.interval}, {self.margin}."
            )


def as_recipe(recipe: Any) -> DelayedScaling:
    """Our DelayedScaling from None, a dict, ours, or Habana's te.recipe.DelayedScaling (same field names)."""
    if recipe is None:
        return DelayedScaling()
    if isinstance(recipe, DelayedScaling):
        return recipe
    names = [f.name for f in fields(DelayedScaling)]
    if isinstance(recipe, Mapping):
        unknown = sorted(set(recipe) - set(names))
        if unknown:
            raise ValueError(f"fp8 recipe has unknown keys {unknown}; known: {names}.")
        return DelayedScaling(**dict(recipe))
    if all(hasattr(recipe, n) for n in ("margin", "interval", "fp8_format")):
        values = {n: getattr(recipe, n) for n in names if hasattr(recipe, n)}
        fmt = values.get("fp8_format")
        values["fp8_format"] = getattr(fmt, "name", fmt)
        if callable(values.get("amax_compute_algo")):
            raise ValueError("A callable amax_compute_algo is not supported by the emulated fp8; use 'max' or "
                             "'most_recent'.")
        return DelayedScaling(**values)
    raise TypeError(f"fp8 recipe must be a DelayedScaling, a dict or None; got {type(recipe).__name__}.")

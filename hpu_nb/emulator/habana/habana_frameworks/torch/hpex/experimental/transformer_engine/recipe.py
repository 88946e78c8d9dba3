"""transformer_engine.recipe, emulated: the fp8 formats and the delayed-scaling recipe, with Habana's field names.

`Format` is hpu_nb's (E4M3, E5M2, HYBRID: E4M3 forward, E5M2 for gradients). `DelayedScaling` takes the fields of
Habana's / NVIDIA's recipe; the emulation runs margin, interval, fp8_format, amax_history_len and amax_compute_algo
("max" or "most_recent") and refuses, when fp8_autocast starts, what it cannot run (a callable amax_compute_algo, a
scaling_factor_compute_algo). reduce_amax is accepted: one emulated card per process keeps its own amaxes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hpu_nb.runtime.fp8.recipe import Format

__emulated__ = True
__all__ = ["DelayedScaling", "Format"]


@dataclass
class DelayedScaling:
    """Scale each fp8 tensor by fp8_max / amax, the amax taken from the last `amax_history_len` steps."""

    margin: int = 0
    interval: int = 1
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: str | Callable[..., Any] = "max"
    scaling_factor_compute_algo: Callable[..., Any] | None = None
    reduce_amax: bool = True
    fp8_dpa: bool = False
    fp8_mha: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.fp8_format, Format):
            raise TypeError(f"fp8_format must be a recipe.Format ({', '.join(f.name for f in Format)}),"
                            f" got {self.fp8_format!r}.")
        if self.scaling_factor_compute_algo is not None:
            raise NotImplementedError("DelayedScaling(scaling_factor_compute_algo=...) is not run by the emulated"
                                      " Gaudi's transformer engine: leave it None (fp8_max / amax / 2**margin).")

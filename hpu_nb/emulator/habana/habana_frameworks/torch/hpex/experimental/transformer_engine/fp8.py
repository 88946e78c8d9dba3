"""transformer_engine.fp8, emulated: `fp8_autocast` and FP8GlobalStateManager, the process's fp8 state.

The state is hpu_nb's emulated fp8 state (hpu_nb.emulator.fp8.training.Fp8State), so hpu_nb's own fp8 helpers and
this module always agree. fp8_autocast(enabled=True) on a first-generation Gaudi raises, as Habana's engine refuses
fp8 there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from habana_frameworks.torch.hpex.experimental.transformer_engine import recipe as te_recipe

from hpu_nb.emulator.fp8.training import Fp8State, fp8_region, fp8_support

__emulated__ = True
__all__ = ["FP8GlobalStateManager", "fp8_autocast"]


class FP8GlobalStateManager:
    """The queries callers make of the fp8 state (class methods, as in Habana's / NVIDIA's engine)."""

    @classmethod
    def is_fp8_available(cls) -> tuple[bool, str]:
        """(available, reason): fp8 needs Gaudi2 or newer."""
        return fp8_support()

    @classmethod
    def is_fp8_enabled(cls) -> bool:
        return Fp8State.enabled

    @classmethod
    def is_fp8_calibration(cls) -> bool:
        return Fp8State.calibrating

    @classmethod
    def get_fp8_recipe(cls) -> Any:
        """The recipe of the innermost fp8_autocast (the default DelayedScaling when it was given none); None
        outside any."""
        return Fp8State.recipe

    @classmethod
    def get_fp8_autocast_depth(cls) -> int:
        return Fp8State.depth

    @classmethod
    def reset_global_state(cls) -> None:
        Fp8State.reset()


@contextlib.contextmanager
def fp8_autocast(
    enabled: bool = True,
    calibrating: bool = False,
    fp8_recipe: Any | None = None,
    fp8_group: Any | None = None,
    force_measurement: bool | None = None,
) -> Iterator[None]:
    """fp8 for the te layers inside the block; nests (the innermost region decides), restores on exit.

    fp8_recipe=None is the default recipe.DelayedScaling(). calibrating=True (with enabled=False) records amaxes in a
    higher-precision run. fp8_group (the group amaxes are reduced over) and force_measurement are accepted; one
    emulated card per process keeps its own amaxes.
    """
    if fp8_recipe is not None and not isinstance(fp8_recipe, te_recipe.DelayedScaling):
        raise TypeError(f"fp8_recipe must be a recipe.DelayedScaling, got {type(fp8_recipe).__name__}.")
    with fp8_region(enabled, fp8_recipe if fp8_recipe is not None else te_recipe.DelayedScaling(), calibrating):
        yield

"""habana_frameworks.torch.activity_profiler, emulated: Habana's HPU activity for torch.profiler.

The bridge's `register_habana_activity_profiler()` replaces `torch.profiler.ProfilerActivity` with an enum that has
`HPU`, and `torch.profiler.profile` / `torch.autograd.profiler.profile` with subclasses that accept it (plus
`debug_activities`) and default to CPU + HPU. The emulated card's ops run on the CPU, so here HPU means CPU events:
a trace asked for HPU activity records the card's ops as CPU ops.

Habana registers when habana_frameworks.torch is imported; the emulated Gaudi only when this function is called, so
hpu_nb's own profiler and other libraries keep torch's profiler unless a script asks for Habana's. Registering twice
changes nothing; `restore_torch_profiler()` undoes it.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum
from typing import Any

import torch

__emulated__ = True
__all__ = ["DebugActivity", "HabanaProfilerActivity", "register_habana_activity_profiler", "restore_torch_profiler"]


class DebugActivity(Enum):
    SYNAPSE_FUNCTION_CALLS = 1
    BRIDGE_FUNCTION_CALLS = 2


class HabanaProfilerActivity(Enum):
    CPU = 1
    CUDA = 2
    HPU = 3


_originals: tuple[Any, Any, Any] | None = None


def register_habana_activity_profiler() -> None:
    """Give torch.profiler the HPU activity, as Habana's import does (idempotent)."""
    global _originals
    if _originals is not None:
        return
    activity, profile, autograd_profile = (torch.profiler.ProfilerActivity, torch.profiler.profile,
                                           torch.autograd.profiler.profile)

    def torch_activities(activities: Iterable[Any]) -> list[Any]:
        names = {getattr(a, "name", None) for a in activities}
        wanted = [activity.CPU] if names & {"CPU", "HPU"} else []  # the emulated card's ops are CPU ops
        return wanted + ([activity.CUDA] if "CUDA" in names else [])

    class habana_profile(profile):
        def __init__(self, *, activities: Iterable[Any] | None = None,
                     debug_activities: Iterable[DebugActivity] | None = None, **kwargs: Any) -> None:
            activities = list(activities) if activities is not None else [HabanaProfilerActivity.CPU,
                                                                          HabanaProfilerActivity.HPU]
            self.hpu_profiling_active = any(getattr(a, "name", None) == "HPU" for a in activities)
            self.debug_activities = list(debug_activities or [])
            super().__init__(activities=torch_activities(activities), **kwargs)

    class habana_autograd_profile_wrapper(autograd_profile):
        """Habana appends its HPU events to the chrome trace; the emulated card's are already in it."""

    _originals = (activity, profile, autograd_profile)
    torch.profiler.profile = habana_profile
    torch.profiler.ProfilerActivity = HabanaProfilerActivity
    torch.autograd.profiler.profile = habana_autograd_profile_wrapper


def restore_torch_profiler() -> None:
    """Put torch's own profiler classes back (emulation only: Habana has no way back)."""
    global _originals
    if _originals is None:
        return
    torch.profiler.ProfilerActivity, torch.profiler.profile, torch.autograd.profiler.profile = _originals
    _originals = None

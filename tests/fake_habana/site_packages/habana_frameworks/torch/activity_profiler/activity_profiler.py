"""Fake habana_frameworks.torch.activity_profiler.activity_profiler: the profiler swap Habana makes on import.

As in activity_profiler.py (1.19): torch.profiler.ProfilerActivity becomes an Enum with CPU, CUDA and HPU,
torch.profiler.profile a subclass that maps the activities back to torch's and records whether HPU profiling was asked
for (HPU has no stock-torch counterpart: Habana's 1.19 code maps it to None, which torch 2.13 refuses, so the fake
leaves it out; Habana's HPU trace comes from its own profiler library, not from torch's activities), and
torch.autograd.profiler.profile a subclass. Uninstalling the fake puts torch's classes back.
"""

from enum import Enum

from habana_frameworks._fake import STATE as _STATE

import torch
import torch.autograd.profiler
import torch.profiler

for _name, _value in (("ProfilerActivity", torch.profiler.ProfilerActivity), ("profile", torch.profiler.profile),
                      ("autograd.profile", torch.autograd.profiler.profile)):
    _STATE.originals.setdefault(_name, _value)

_original_activity = _STATE.originals["ProfilerActivity"]


class habana_autograd_profile_wrapper(_STATE.originals["autograd.profile"]):
    pass


class habana_profile(_STATE.originals["profile"]):
    def __init__(self, *, activities=None, debug_activities=None, **kwargs):
        activities = (HabanaProfilerActivity.CPU, HabanaProfilerActivity.HPU) if activities is None else activities
        self.hpu_profiling_active = HabanaProfilerActivity.HPU in activities
        _STATE.calls.record("habana_frameworks.torch.activity_profiler.profile", (), {"activities": list(activities)})
        exchanged = [self._exchange_activity(a) for a in activities]
        super().__init__(activities=[a for a in exchanged if a is not None], **kwargs)

    def _exchange_activity(self, activity):
        if activity == HabanaProfilerActivity.CPU:
            return _original_activity.CPU
        if activity == HabanaProfilerActivity.CUDA:
            return _original_activity.CUDA
        return None


class HabanaProfilerActivity(Enum):
    CPU = 1
    CUDA = 2
    HPU = 3


torch.profiler.ProfilerActivity = HabanaProfilerActivity
torch.profiler.profile = habana_profile
torch.autograd.profiler.profile = habana_autograd_profile_wrapper

"""Fake habana_frameworks.torch: importing it swaps torch.profiler.ProfilerActivity for a Python Enum, like the real
one."""

import enum

import torch.profiler

from habana_frameworks._fake import STATE as _STATE

if _STATE.config.import_error:
    raise ImportError(_STATE.config.import_error)

__version__ = _STATE.config.version

_STATE.calls.record("import habana_frameworks.torch")
if "ProfilerActivity" not in _STATE.originals:
    _STATE.originals["ProfilerActivity"] = torch.profiler.ProfilerActivity


class ProfilerActivity(enum.Enum):
    CPU = 0
    CUDA = 1
    HPU = 2


torch.profiler.ProfilerActivity = ProfilerActivity

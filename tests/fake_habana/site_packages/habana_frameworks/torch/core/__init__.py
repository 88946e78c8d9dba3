"""Fake habana_frameworks.torch.core: mark_step / is_lazy; importing it registers torch.hpu like the real one."""

import os

import torch

import habana_frameworks.torch.hpu as _hthpu
from habana_frameworks.torch import hpu  # noqa: F401  (htcore.hpu, as in Habana's core)
from habana_frameworks._fake import STATE as _STATE
from habana_frameworks._fake import recorded as _recorded

_STATE.calls.record("import habana_frameworks.torch.core")
if getattr(torch, "hpu", None) is not _hthpu:
    if hasattr(torch, "hpu"):
        delattr(torch, "hpu")  # the emulated Gaudi's module, from an earlier test in this process
    torch._register_device_module("hpu", _hthpu)
    _STATE.originals["torch.hpu registered"] = True


@_recorded
def is_lazy():
    return os.environ.get("PT_HPU_LAZY_MODE", "1").strip() != "0"


@_recorded
def mark_step(device_str="", sync=False):
    return None


@_recorded
def hpu_set_env(model=None):
    return None


@_recorded
def hpu_initialize(model=None, mark_only_scales_as_const=False, optimizer=None, args=None):
    return None

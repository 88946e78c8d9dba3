"""Fake habana_frameworks.torch.core: mark_step / is_lazy / quantization set-up; importing it, as Habana's does:
registers torch.hpu, registers torch.compile's "hpu_backend" (eager and lazy mode), and sets HABANA_PROFILE when
unset.

mark_step in lazy mode ends the accumulated graph (here: counted, then the step closures run); in eager mode it has no
graph to end. Every call is recorded either way, so tests see what was asked of Habana.
"""

import os

import habana_frameworks.torch.hpu as _hthpu
from habana_frameworks._fake import STATE as _STATE
from habana_frameworks._fake import recorded as _recorded
from habana_frameworks.torch import hpu  # noqa: F401  (htcore.hpu, as in Habana's core)
from habana_frameworks.torch.utils.internal import is_lazy

import torch

_STATE.calls.record("import habana_frameworks.torch.core")
if getattr(torch, "hpu", None) is not _hthpu:
    _STATE.originals.setdefault("torch.hpu", getattr(torch, "hpu", None))
    if hasattr(torch, "hpu"):
        delattr(torch, "hpu")  # the emulated Gaudi's module, from an earlier test in this process
    torch._register_device_module("hpu", _hthpu)

graphs_run = 0  # graphs lazy mode ended with mark_step
_step_closures = []


@_recorded
def mark_step(device_str="", sync=False):
    global graphs_run
    if is_lazy():
        graphs_run += 1
        closures = list(_step_closures)
        _step_closures.clear()
        for closure in closures:
            closure()


@_recorded
def add_step_closure(closure, args=()):
    _step_closures.append(lambda: closure(*args))


@_recorded
def hpu_set_env(model=None):
    return None


@_recorded
def hpu_initialize(model=None, mark_only_scales_as_const=False, optimizer=None, args=None):
    return None


# As Habana's 1.19 core: it imports dynamo.compile_backend.backends at the top in either mode (for import_compilers),
# which registers "hpu_backend" in lazy mode too.
import habana_frameworks.torch.dynamo.compile_backend  # noqa: E402, F401  (registers "hpu_backend")

if "HABANA_PROFILE" not in os.environ:
    os.environ["HABANA_PROFILE"] = "profile_api_light"

from habana_frameworks.torch.core import _autocast_lists  # noqa: E402  (read now: the release reads them at start)


def _apply_lists_if_device_loaded():
    from hpu_nb.emulator import hpu_device

    if hpu_device.is_loaded():
        _autocast_lists.apply()


_apply_lists_if_device_loaded()

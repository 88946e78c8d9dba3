"""The autocast op lists of the fake's release, read once at import (process start) as Habana's bridge reads them.

Up to 1.18 the files are named by LOWER_LIST / FP32_LIST, from 1.19 by PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST /
PT_HPU_AUTOCAST_FP32_OPS_LIST; a file replaces the default list (hpu_ops/autocast_helpers). The casting itself is the
emulated hpu device's AutocastHPU kernels, given these lists.
"""

from habana_frameworks._fake import STATE as _STATE


def _read():
    from hpu_nb.emulator.hpu_device import autocast

    lower_env, fp32_env = _STATE.config.op_list_envs
    lower, lower_source = autocast.read_list_file(lower_env, autocast.DEFAULT_LOWER_OPS)
    fp32, fp32_source = autocast.read_list_file(fp32_env, autocast.DEFAULT_FP32_OPS)
    return autocast.AutocastLists(lower, fp32, lower_source, fp32_source)


LISTS = _read()
_applied = False


def apply():
    """Put LISTS on the device, once it is loaded (what Habana's library does when it loads)."""
    global _applied
    from hpu_nb.emulator.hpu_device import autocast

    if not _applied:
        autocast.register(LISTS)
        _applied = True

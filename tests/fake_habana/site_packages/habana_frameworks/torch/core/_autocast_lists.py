"""The autocast op lists of the fake's release, read once at import (process start) as Habana's bridge reads them.

Up to 1.18 the files are named by LOWER_LIST / FP32_LIST, from 1.19 by PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST /
PT_HPU_AUTOCAST_FP32_OPS_LIST; a file replaces the default list (hpu_ops/autocast_helpers). The casting itself is the
emulated hpu device's AutocastHPU kernels, given these lists.
"""

import os

from habana_frameworks._fake import STATE as _STATE


def load_list(env_name, default):
    """As the bridge's hpu_ops/backend/autocast_helpers.cpp `load_list`, written apart from hpu_nb's reader: unset ->
    the default; a file that cannot be opened -> a warning and the default; otherwise every line `getline` returns,
    verbatim (only the newline removed: spaces, comments, "\r" and empty lines are op names that match nothing), and
    the file replaces the whole default list. Returns (ops, source)."""
    path = os.environ.get(env_name)
    if path is None:
        return frozenset(default), "default"
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError:
        import warnings

        warnings.warn(f"Failed to open file with ops to autocast: {path}. Default list loaded.", stacklevel=2)
        return frozenset(default), "default"
    text = data.decode("utf-8", errors="surrogateescape")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # getline stops at the end: a final newline ends the last line, it starts no empty one
    return frozenset(lines), path


def _read():
    from hpu_nb.emulator.hpu_device import autocast

    lower_env, fp32_env = _STATE.config.op_list_envs
    lower, lower_source = load_list(lower_env, autocast.DEFAULT_LOWER_OPS)
    fp32, fp32_source = load_list(fp32_env, autocast.DEFAULT_FP32_OPS)
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

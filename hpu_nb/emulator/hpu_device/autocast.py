"""Autocast on the emulated `hpu` device: Habana's op lists and casting policies, applied at the AutocastHPU key.

Modelled on Habana's bridge (hpu_ops/autocast_helpers, release 1.19; its default lists, a fact about Habana's software
on both backends, live in hpu_nb.runtime.autocast_lists): ops in the lower-precision list run in the
autocast dtype (normalisation layers cast only their input), ops in the fp32 list run in float32, and a few
element-wise ops run in the widest floating type of their inputs. A list file named by
PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST / PT_HPU_AUTOCAST_FP32_OPS_LIST **replaces** the default list; each line is
one ATen op name, read verbatim, at device start only. Like the bridge, a file that cannot be read leaves the default
list in force with a warning; the old names LOWER_LIST / FP32_LIST are no longer read (1.19+), and say so once.
"""

from __future__ import annotations

import functools
import os
import warnings
from dataclasses import dataclass
from enum import IntEnum

import torch

from hpu_nb.runtime.autocast_lists import DEFAULT_FP32_OPS, DEFAULT_LOWER_OPS  # Habana's defaults, on both backends
from hpu_nb.runtime.files import read_small_file
from hpu_nb.runtime.generations import EMULATED_RELEASE, FP32_LIST_ENV, LOWER_LIST_ENV

PROMOTE_OPS = frozenset({"add", "addcmul", "addcdiv", "cat", "div", "exp", "mul", "pow", "sub", "iadd", "truediv",
                         "stack"})
LOWER_FIRST_ARG_OPS = frozenset({"layer_norm", "group_norm", "instance_norm", "batch_norm"})


class CastPolicy(IntEnum):
    """How an op's floating inputs are cast under autocast (numbers shared with hpu_device.cpp)."""

    LOWER = 0
    FP32 = 1
    PROMOTE = 2
    LOWER_FIRST_ARG = 3


@dataclass(frozen=True)
class AutocastLists:
    """The op lists in force on the device, and where each came from ("default" or a file path)."""

    lower: frozenset[str]
    fp32: frozenset[str]
    lower_source: str = "default"
    fp32_source: str = "default"

    def policy(self, op: str) -> CastPolicy | None:
        """Habana's precedence: the lower list, then the fp32 list, then the promote list."""
        if op in self.lower:
            return CastPolicy.LOWER_FIRST_ARG if op in LOWER_FIRST_ARG_OPS else CastPolicy.LOWER
        if op in self.fp32:
            return CastPolicy.FP32
        if op in PROMOTE_OPS:
            return CastPolicy.PROMOTE
        return None

    def policies(self) -> dict[str, CastPolicy]:
        """Every op name that autocasts, with its policy."""
        names = self.lower | self.fp32 | PROMOTE_OPS
        return {name: policy for name in sorted(names) if (policy := self.policy(name)) is not None}


def read_list_file(
    env_name: str, default: frozenset[str], environ: dict[str, str] | None = None
) -> tuple[frozenset[str], str]:
    """(ops, source) for one list: the named file's lines, verbatim, or the default list when unset/unreadable."""
    environ = os.environ if environ is None else environ
    path = environ.get(env_name)
    if not path:
        return default, "default"
    try:
        text = read_small_file(path, "op-list file").decode("utf-8")
    except OSError as err:  # missing, unreadable, a device such as /dev/zero, a FIFO, too large
        warnings.warn(f"{env_name}={path!r} cannot be read ({err}); the default autocast list is used, as on a"
                      " Gaudi.", stacklevel=3)
        return default, "default"
    except UnicodeDecodeError:
        warnings.warn(f"{env_name}={path!r} is not a text file of op names (one ATen op per line); the default"
                      " autocast list is used, as on a Gaudi.", stacklevel=3)
        return default, "default"
    ops = frozenset(line for line in text.splitlines())
    unknown = sorted(op for op in ops if op not in aten_op_overloads())
    if unknown:
        warnings.warn(f"{env_name}={path!r} names {len(unknown)} line(s) that are not ATen ops, which Habana's"
                      f" bridge ignores: {', '.join(repr(op) for op in unknown[:8])}", stacklevel=3)
    return ops, path


def lists_from_environment(environ: dict[str, str] | None = None) -> AutocastLists:
    """The lists a Gaudi running today's software would use, given these environment variables."""
    environ = os.environ if environ is None else environ
    for old, new in EMULATED_RELEASE.ignored_op_list_envs(environ):
        warnings.warn(f"{old} is not read by Gaudi software 1.19 and newer: name the file in {new} instead"
                      " (the default list is in force).", stacklevel=3)
    lower, lower_source = read_list_file(LOWER_LIST_ENV, DEFAULT_LOWER_OPS, environ)
    fp32, fp32_source = read_list_file(FP32_LIST_ENV, DEFAULT_FP32_OPS, environ)
    return AutocastLists(lower, fp32, lower_source, fp32_source)


@functools.lru_cache(maxsize=1)
def aten_op_overloads() -> dict[str, tuple[str, ...]]:
    """ATen op name -> its functional overload names ("" for the default overload).

    `out=` and in-place overloads are left out, as Habana registers only the `at::` functions of each name.
    """
    overloads: dict[str, list[str]] = {}
    for qualified in torch._C._dispatch_get_all_op_names():
        namespace, _, rest = qualified.partition("::")
        if namespace != "aten":
            continue
        name, _, overload = rest.partition(".")
        functional = overloads.setdefault(name, [])
        if not torch._C._get_schema(f"aten::{name}", overload).is_mutable:
            functional.append(overload)
    return {name: tuple(values) for name, values in overloads.items()}


def register(lists: AutocastLists) -> None:
    """Install `lists` at the AutocastHPU key of the loaded device library (replacing what was there)."""
    overloads = aten_op_overloads()
    torch.ops.hpu_emu.clear_autocast()
    for name, policy in lists.policies().items():
        if name in overloads:
            torch.ops.hpu_emu.register_autocast(f"aten::{name}", list(overloads[name]), int(policy))

"""Is DeepSpeed about to compile one of its C++ ops? Say so before a cell goes silent for minutes.

DeepSpeed compiles its ops with torch's JIT extension builder on first use, into TORCH_EXTENSIONS_DIR; through its HPU
accelerator (on a Gaudi and on the emulated one) that is DeepSpeedCPUAdam, for ZeRO-Offload. `make setup` builds it
there once; a notebook cell that would still compile one calls `announce_compilation()` first, which prints what will
be compiled and how long it takes. Ops the accelerator does not have are not announced.
"""

from __future__ import annotations

import os
from pathlib import Path

from hpu_nb.core.strategies.deepspeed import require_deepspeed

OPS = {"ShareMemCommBuilder": "the CPU communication op", "CPUAdamBuilder": "DeepSpeedCPUAdam (ZeRO-Offload)"}
MINUTES_EACH = 2  # measured: about 2 minutes per op on a 2-core machine


DEFAULT_BUILDERS = ("CPUAdamBuilder",)


def unbuilt_ops(builders: tuple[str, ...] = DEFAULT_BUILDERS) -> list[str]:
    """The builders among `builders` whose compiled library is not in the extensions folder yet."""
    require_deepspeed()
    from deepspeed.accelerator import get_accelerator  # noqa: PLC0415 -- lazy: deepspeed is optional
    from torch.utils.cpp_extension import _get_build_directory  # noqa: PLC0415 -- lazy: ~0.5 s, with deepspeed only

    missing = []
    for name in builders:
        builder = get_accelerator().create_op_builder(name)
        if builder is None:
            continue
        folder = Path(_get_build_directory(builder.name, verbose=False))
        if not any(folder.glob(f"{builder.name}*.so")):
            missing.append(name)
    return missing


def announce_compilation(builders: tuple[str, ...] = DEFAULT_BUILDERS) -> list[str]:
    """Print which DeepSpeed ops the next run compiles, and about how long that takes; returns their builders."""
    missing = unbuilt_ops(builders)
    if missing:
        what = " and ".join(OPS.get(name, name) for name in missing)
        where = os.environ.get("TORCH_EXTENSIONS_DIR", "torch's default extensions folder")
        print(f"DeepSpeed compiles {what} first: about {MINUTES_EACH * len(missing)} minutes, once "
              f"(cached in {where}; `make setup` builds it ahead).", flush=True)
    return missing

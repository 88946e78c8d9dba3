"""Is DeepSpeed about to compile one of its C++ ops? Say so before a cell goes silent for minutes.

DeepSpeed compiles its ops with torch's JIT extension builder on first use, into TORCH_EXTENSIONS_DIR; through its HPU
accelerator (on a Gaudi and on the emulated one) that is DeepSpeedCPUAdam, for ZeRO-Offload. `make setup` builds it
there once, and a ZeRO-Offload fit builds what is still missing before its workers start, saying so
(hpu_nb.core.strategies.deepspeed_ops). `announce_compilation()` says it earlier, in a cell of its own: what will be
compiled and about how long it takes. Ops the accelerator does not have are not announced.
"""

from __future__ import annotations

import os

from hpu_nb.core.strategies.deepspeed_ops import BUILDERS, MINUTES, OPS, pending_builds

DEFAULT_BUILDERS = BUILDERS


def unbuilt_ops(builders: tuple[str, ...] = DEFAULT_BUILDERS) -> list[str]:
    """The builders among `builders` whose op a load would still compile (no library, or ninja has work there)."""
    return pending_builds(builders)


def announce_compilation(builders: tuple[str, ...] = DEFAULT_BUILDERS) -> list[str]:
    """Print which DeepSpeed ops the next run compiles, and about how long that takes; returns their builders."""
    missing = unbuilt_ops(builders)
    if missing:
        what = " and ".join(OPS.get(name, name) for name in missing)
        where = os.environ.get("TORCH_EXTENSIONS_DIR", "torch's default extensions folder")
        print(f"DeepSpeed compiles {what} first: about {MINUTES} minutes per op (measured on 2 cores), once "
              f"(cached in {where}; `make setup` builds it ahead).", flush=True)
    return missing

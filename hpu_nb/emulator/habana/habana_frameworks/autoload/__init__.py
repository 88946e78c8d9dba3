"""habana_frameworks.autoload, emulated: Habana's entry point for torch's device-backend autoload.

As the bridge's: `is_autoload_enabled()` follows PT_HPU_AUTOLOAD ("1" / "0"), else loads in eager mode only; the
entry function `__autoload()` imports habana_frameworks.torch once. On the emulated Gaudi, hpu_nb's own torch
entry point does that job at `import torch` (with the same rule, runtime.generations.Release.autoloads); calling this
one as well is harmless: it does nothing when habana_frameworks.torch is already loaded or autoload is off.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from hpu_nb.runtime.generations import EMULATED_RELEASE

__emulated__ = True
_loaded_here = False


def is_autoload_enabled() -> bool:
    return EMULATED_RELEASE.autoloads(os.environ)


def _is_loaded() -> bool:
    return _loaded_here or "habana_frameworks.torch" in sys.modules


def __autoload() -> None:
    global _loaded_here
    if _is_loaded() or not is_autoload_enabled():
        return
    import habana_frameworks.torch  # noqa: F401, PLC0415 -- lazy: the entry point imports torch only when called

    _loaded_here = True


def __getattr__(name: str) -> Any:
    if name == "is_loaded":  # Habana's flag: True once habana_frameworks.torch is imported
        return _is_loaded()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

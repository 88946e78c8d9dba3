"""Is Habana's own `habana_frameworks` installed? A question about the machine, asked before choosing a backend.

The runtime asks it to pick the device backend; the emulator's import finder asks it so as never to shadow Habana's
package; core asks it when registering with Lightning. Looking the package up on sys.path imports nothing. Whether an
imported module is hpu_nb's emulation is asked here too (by its mark, importing nothing of the emulator).
"""

from __future__ import annotations

import importlib.machinery
from typing import Any

HABANA_PACKAGE = "habana_frameworks"
# Every module of hpu_nb's emulated surface (and the emulated graph compiler) carries `__emulated__ = True`: how the
# runtime tells it from Habana's software without importing the emulator.
EMULATED_MARK = "__emulated__"


def real_habana_spec() -> Any:
    """The spec of an installed `habana_frameworks` on sys.path (Habana's, or the test fake), else None."""
    return importlib.machinery.PathFinder.find_spec(HABANA_PACKAGE)


def is_emulated(obj: Any) -> bool:
    """Whether `obj` (a module or function) is hpu_nb's emulation rather than Habana's software or the test fake."""
    return getattr(obj, EMULATED_MARK, False) is True


__all__ = ["EMULATED_MARK", "HABANA_PACKAGE", "is_emulated", "real_habana_spec"]

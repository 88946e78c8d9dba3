"""Is Habana's own `habana_frameworks` installed? A question about the machine, asked before choosing a backend.

The runtime asks it to pick the device backend; the emulator's import finder asks it so as never to shadow Habana's
package; core asks it when registering with Lightning. Looking the package up on sys.path imports nothing.
"""

from __future__ import annotations

import importlib.machinery
from typing import Any

HABANA_PACKAGE = "habana_frameworks"


def real_habana_spec() -> Any:
    """The spec of an installed `habana_frameworks` on sys.path (Habana's, or the test fake), else None."""
    return importlib.machinery.PathFinder.find_spec(HABANA_PACKAGE)


__all__ = ["HABANA_PACKAGE", "real_habana_spec"]

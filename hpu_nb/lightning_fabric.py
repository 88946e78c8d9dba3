"""hpu_nb's Fabric pieces for the standalone `lightning_fabric` package: `from hpu_nb.lightning_fabric import ...`.

The same code as `hpu_nb.fabric` (hpu_nb.core.fabric), translated onto lightning_fabric's classes
(hpu_nb/wiring/flavours.py).
"""

from __future__ import annotations

from typing import Any

from hpu_nb.wiring import flavours

__all__ = list(flavours.FABRIC_NAMES)  # served by __getattr__: importing them here would load Lightning


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(flavours.core_module("standalone", "fabric"), name)
    globals()[name] = value
    return value

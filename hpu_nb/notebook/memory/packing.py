"""Samples to the front end as one binary buffer of float64 (no per-number JSON work), and back."""

from __future__ import annotations

from array import array
from typing import Any

from hpu_nb.notebook.memory.history import FIELDS


def pack_points(points: list[list[float]]) -> memoryview:
    """Points as one binary buffer of float64 (exact for byte counts below 2**53): no per-number JSON work."""
    flat = array("d")
    for point in points:
        flat.extend(point)
    return memoryview(flat.tobytes())


def unpack_points(buffer: Any) -> list[list[float]]:
    """The inverse of pack_points (what the front end does with the buffer)."""
    flat = array("d")
    flat.frombytes(bytes(buffer))
    n = len(FIELDS)
    return [list(flat[i:i + n]) for i in range(0, len(flat), n)]

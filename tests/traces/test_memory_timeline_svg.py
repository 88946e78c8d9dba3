"""trace.memory()'s chart says what it shows (issue 39): a title, bytes and milliseconds on its axes, the devices."""

from __future__ import annotations

import numpy as np

from hpu_nb.traces.memory import MemoryTimeline


def test_the_memory_chart_has_axes_units_and_device_names() -> None:
    rows = np.array([[1_000_000, 0, 0], [3_000_000, 2 * 2**20, 2 * 2**20], [5_000_000, 2**20, 2 * 2**20]],
                    dtype=np.int64)
    svg = MemoryTimeline({"hpu:0": rows}).svg()
    assert "allocated memory over time" in svg
    assert ">0 B</text>" in svg and ">2 MiB</text>" in svg  # bytes: 0 and the peak
    assert ">0 ms</text>" in svg and ">4 ms</text>" in svg  # milliseconds since the first event
    assert ">hpu:0</text>" in svg
    points = svg.split("points='")[1].split("'")[0].split()
    assert points[0].startswith("64.0,") and float(points[1].split(",")[1]) < float(points[0].split(",")[1])

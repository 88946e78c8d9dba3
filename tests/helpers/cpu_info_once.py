"""DeepSpeedCPUAdam asks py-cpuinfo for the CPU vendor each time one is made, and py-cpuinfo answers from a new
Python subprocess every time: 1.2 s per optimizer on this machine (cProfile), two thirds of the widget test's DeepSpeed
time. The CPU does not change within a test process, so test processes ask once. (hpu_nb itself leaves DeepSpeed as
it is: a user pays this once per offloading Trainer.)"""

from __future__ import annotations

import functools


def ask_cpu_info_once() -> None:
    try:
        import cpuinfo
    except ImportError:  # DeepSpeed (which brings py-cpuinfo) is optional
        return
    if not hasattr(cpuinfo.get_cpu_info, "cache_info"):
        cpuinfo.get_cpu_info = functools.cache(cpuinfo.get_cpu_info)  # DeepSpeed imports the name at each call

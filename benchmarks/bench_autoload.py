"""What hpu_nb's torch autoload costs on `import torch` (target: <= 20 ms).

Two figures, each from fresh Python processes (CPU time is the steadier one on a shared machine):
1. the autoload itself: in a process whose `import torch` ran without it (HPU_NB_AUTOLOAD=0), the time of running the
   entry point once (`import hpu_nb`, the Lightning hooks, the emulated habana_frameworks finder and, when built, the
   hpu device library) - exactly what `import torch` adds, without the noise of importing torch;
2. `import torch` with the autoload on vs off, interleaved, median of the paired differences (noisy on a busy machine:
   shown as a cross-check).
Processes run as a user's Python does, with the bytecode cache: where PYTHONDONTWRITEBYTECODE is set (this machine's
shells set it), every process would compile hpu_nb's modules from source again (about 10 ms, measured with cProfile),
which no installed package pays. The first, warming run writes the cache.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "9"))

OWN_COST = """
import os, time, torch
import _hpu_nb_autoload
os.environ["HPU_NB_AUTOLOAD"] = "1"
wall, cpu = time.perf_counter(), time.process_time()
_hpu_nb_autoload.load()
print((time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000)
"""

IMPORT_TORCH = """
import time
start = time.perf_counter()
import torch
print((time.perf_counter() - start) * 1000)
"""


def run(code: str, autoload: str) -> list[float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPU_NB_") and k != "PYTHONDONTWRITEBYTECODE"}
    env["HPU_NB_AUTOLOAD"] = autoload
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return [float(x) for x in out.stdout.strip().splitlines()[-1].split()]


def main() -> None:
    run(IMPORT_TORCH, "1")  # warm the file cache and write the bytecode cache
    own = [run(OWN_COST, "0") for _ in range(ROUNDS)]
    wall, cpu = [w for w, _ in own], [c for _, c in own]
    on, off = [], []
    for _ in range(ROUNDS):
        on.append(run(IMPORT_TORCH, "1")[0])
        off.append(run(IMPORT_TORCH, "0")[0])
    diffs = [a - b for a, b in zip(on, off)]
    print(f"autoload entry point, own cost: CPU time median {statistics.median(cpu):.1f} ms (min {min(cpu):.1f}),"
          f" wall time median {statistics.median(wall):.1f} ms (min {min(wall):.1f}); target <= 20 ms")
    print(f"import torch: autoload on {statistics.median(on):.0f} ms, off {statistics.median(off):.0f} ms, "
          f"paired difference median {statistics.median(diffs):+.1f} ms ({ROUNDS} rounds, interleaved)")


if __name__ == "__main__":
    main()

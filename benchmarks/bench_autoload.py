"""What hpu_nb's torch autoload costs on `import torch` (target: <= 20 ms), and what its start-up `.pth` costs every
Python program of the environment (target: nothing measurable against the interpreter's own start-up).

Three figures, each from fresh Python processes (CPU time is the steadier one on a shared machine):
1. the autoload itself: in a process whose `import torch` ran without it (HPU_NB_AUTOLOAD=0), the time of running the
   entry point once (`import hpu_nb`, the Lightning hooks, the emulated habana_frameworks finder and, when built, the
   hpu device library) - exactly what `import torch` adds, without the noise of importing torch;
2. `import torch` with the autoload on vs off, interleaved, median of the paired differences (noisy on a busy machine:
   shown as a cross-check);
3. the start-up `.pth` (hpu_nb-habana.pth: a finder for `import habana_frameworks` as a first line, and the emulated
   release's metadata), which every Python process of the environment runs, `import habana_frameworks` or not: a
   fresh `python -S` processes a site folder holding only that `.pth`, or an empty one (paired, interleaved), timed
   in-process; beside it the CPU time of a whole `python -c "import sys"` start-up.
4. the device library's check before it is loaded (in this process, the built library): the stamp check that
   `import torch` makes (the file's inode, size, mtime and ctime as when its SHA-256 was last checked) vs the full
   SHA-256 it replaces once per change of the file.
Processes run as a user's Python does, with the bytecode cache: where PYTHONDONTWRITEBYTECODE is set (this machine's
shells set it), every process would compile hpu_nb's modules from source again (about 10 ms, measured with cProfile),
which no installed package pays. The first, warming run writes the cache.
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


PTH = Path(__file__).resolve().parent.parent / "hpu_nb-habana.pth"
ADD_SITE = """
import sys, time, site
sys.path.insert(0, {root!r})
wall, cpu = time.perf_counter(), time.process_time()
site.addsitedir({site!r})
print((time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000)
"""


def pth_cost() -> tuple[list[float], list[float], list[float]]:
    """(with the .pth, without, whole `python -c "import sys"`) CPU times in ms."""
    with tempfile.TemporaryDirectory() as with_pth, tempfile.TemporaryDirectory() as without:
        shutil.copy(PTH, with_pth)
        root = str(PTH.parent)
        on, off, whole = [], [], []
        for _ in range(ROUNDS):
            for site_dir, out in ((with_pth, on), (without, off)):
                code = ADD_SITE.format(root=root, site=site_dir)
                result = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                                        env=user_env(), check=True)
                out.append(float(result.stdout.split()[1]))
            start = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([sys.executable, "-c", "import sys"], env=user_env(), check=True)
            end = resource.getrusage(resource.RUSAGE_CHILDREN)
            whole.append((end.ru_utime + end.ru_stime - start.ru_utime - start.ru_stime) * 1000)
        return on, off, whole


def user_env(autoload: str = "1") -> dict[str, str]:
    """The environment of a user's Python: no HPU_NB_ settings, the bytecode cache on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPU_NB_") and k != "PYTHONDONTWRITEBYTECODE"}
    env["HPU_NB_AUTOLOAD"] = autoload
    return env


def run(code: str, autoload: str) -> list[float]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=user_env(autoload),
                         check=True)
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
    with_pth, without, whole = pth_cost()
    extra = [a - b for a, b in zip(with_pth, without)]
    print(f"start-up .pth (every Python of the environment): CPU time median {statistics.median(with_pth):.3f} ms"
          f" with it vs {statistics.median(without):.3f} ms without, paired difference median"
          f" {statistics.median(extra):+.3f} ms; a whole `python -c 'import sys'`:"
          f" {statistics.median(whole):.1f} ms CPU"
          f" (ratio of the .pth's cost to it: {statistics.median(extra) / statistics.median(whole):.4f})")
    stamped, hashed = library_check_cost()
    print(f"device library check before loading: stamp {stamped:.3f} ms vs full SHA-256 {hashed:.3f} ms CPU (median;"
          f" the full hash runs once per change of the file; ratio {stamped / hashed:.2f})")


def library_check_cost() -> tuple[float, float]:
    """(stamp check, full SHA-256 check) of the built library, CPU time in ms, median of ROUNDS * 5."""
    from hpu_nb.emulator.hpu_device import build  # only for this figure: it imports torch

    library = build.library_path()
    if not library.exists():
        return float("nan"), float("nan")
    build.library_problem(library)  # writes the stamp if the file changed since its last check
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(ROUNDS * 5):
        for full in (False, True):
            start = time.process_time()
            build.library_problem(library, check_digest=full)
            times[full].append((time.process_time() - start) * 1000)
    return statistics.median(times[False]), statistics.median(times[True])


if __name__ == "__main__":
    main()

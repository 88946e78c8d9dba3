"""What the standalone flavour's bytecode cache saves: loading hpu_nb's translated modules (hpu_nb._standalone, for
`pytorch_lightning` / `lightning_fabric`) by translating + compiling the source, vs reading the cached code.

Measured side by side in one process, for every translated module (hpu_nb/core and the MemoryMonitor), interleaved
over rounds, CPU time: (a) translate + compile, what every process did before the cache (each rank of a job, each new
kernel); (b) `translated_code` with the cache filled, what they do now. Importing pytorch_lightning itself is not part
of either (it is the same for both). The cache lives in a temporary HPU_NB_CACHE_DIR.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "7"))


def main() -> None:
    os.environ["HPU_NB_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-mirror-")
    sys.dont_write_bytecode = False
    from hpu_nb.wiring import flavours

    files = sorted((flavours.PACKAGE_ROOT / "core").rglob("*.py")) + [
        flavours.PACKAGE_ROOT / "notebook" / "memory_monitor.py"]
    names = [f"{flavours.STANDALONE}.{'.'.join(f.relative_to(flavours.PACKAGE_ROOT).with_suffix('').parts)}"
             for f in files]
    for path, name in zip(files, names):  # fill the cache
        flavours.translated_code(path, name)
    compile_s, cached_s = [], []
    for _ in range(ROUNDS):
        start = time.process_time()
        for path in files:
            compile(flavours.translate(path.read_text(encoding="utf-8")), str(path), "exec", dont_inherit=True)
        compile_s.append(time.process_time() - start)
        start = time.process_time()
        for path, name in zip(files, names):
            flavours.translated_code(path, name)
        cached_s.append(time.process_time() - start)
    compiled, cached = statistics.median(compile_s), statistics.median(cached_s)
    print(f"{len(files)} translated modules ({sum(Path(f).stat().st_size for f in files) / 1024:.0f} KiB of source),"
          f" median of {ROUNDS} rounds, CPU time per process:")
    print(f"  translate + compile: {compiled * 1000:7.1f} ms")
    print(f"  from the cache:      {cached * 1000:7.1f} ms")
    print(f"  ratio (cache / translate + compile): {cached / compiled:.3f}x")


if __name__ == "__main__":
    main()

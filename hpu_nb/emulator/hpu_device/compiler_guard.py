"""The compiler's guard: run the C++ compiler in a process group of its own and kill that group with its builder.

build.py starts this file as a script (`python -S compiler_guard.py PARENT_PID COMMAND...`), without site-packages or
torch, so it imports nothing but the standard library. On SIGTERM / SIGINT / SIGHUP, or when the building process is
already gone, the whole group (driver, cc1plus, as, ld) is killed: no orphaned compiler keeps running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys


def guard(parent: int, command: list[str]) -> int:
    """Run `command` in a process group of its own; on SIGTERM/SIGINT/SIGHUP (or `parent` gone) kill that group."""
    compiler = subprocess.Popen(command, start_new_session=True)

    def stop(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(compiler.pid, signal.SIGKILL)
        os._exit(128 + signum)  # no wait() here: the main thread may be inside it

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)
    if os.getppid() != parent:  # the building process died before the handlers were set
        stop(signal.SIGTERM, None)
    return compiler.wait()


if __name__ == "__main__":
    sys.exit(guard(int(sys.argv[1]), sys.argv[2:]))

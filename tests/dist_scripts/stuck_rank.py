"""How a rank of a test run stops answering (imported by fit.py and fabric_fit.py, which run from this folder)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

HOW = ("sleep", "stop", "kill")


def get_stuck(out: str | Path, rank: int, how: str = "sleep") -> None:
    """Write <out>/stuck<rank>.pid, then: sleep ten minutes (a deadlock, a hung data source, a stuck device), SIGSTOP
    this process (a debugger, Ctrl-Z, a frozen container), or SIGKILL it (the kernel's OOM killer)."""
    if how not in HOW:
        raise ValueError(f"how={how!r} is not one of {HOW}")
    Path(out, f"stuck{rank}.pid").write_text(str(os.getpid()))
    if how == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(600)

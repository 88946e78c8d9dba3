"""`python -m hpu_nb.core.strategies.deepspeed_ops`: build DeepSpeed's C++ ops now, not in a notebook cell.

ZeRO-Offload's DeepSpeedCPUAdam is a C++ op DeepSpeed compiles with torch's extension builder on first use (minutes
here), into TORCH_EXTENSIONS_DIR. This builds it through DeepSpeed's HPU accelerator with the environment hpu_nb gives
DeepSpeed (`require_deepspeed`: the same folder and the same ninja as a fit), as a Trainer's ZeRO-Offload would.
`make setup` and Binder's postBuild run it, so no notebook cell compiles anything.

Where something is still to build at fit time (`pending_builds`: what ninja itself would still run), the launching
process builds it before any worker starts (`build_announced`): it says what it compiles and about how long that
takes, and an interrupt stops the compiler with one line, no worker's C++ trace, and keeps the objects already built
(ninja removes only the half-written ones), so the next fit compiles only the rest.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from hpu_nb.core.strategies.deepspeed_config import require_deepspeed
from hpu_nb.core.strategy_parts.interrupts import FitInterrupted

BUILDERS = ("CPUAdamBuilder",)  # what ZeRO-Offload loads through the HPU accelerator
OPS = {"ShareMemCommBuilder": "the CPU communication op", "CPUAdamBuilder": "DeepSpeedCPUAdam (ZeRO-Offload)"}
# measured for CPUAdamBuilder (2 objects compiled side by side, then linked): 2 minutes on an idle 2-core machine,
# 4-5 minutes on a loaded one
MINUTES = "2-5"


def build_ops(builders: tuple[str, ...] = BUILDERS) -> None:
    """Compile (or find already compiled) each op in `builders`."""
    require_deepspeed()
    from deepspeed.accelerator import get_accelerator  # noqa: PLC0415 -- lazy: deepspeed is optional (its extra)

    for name in builders:
        get_accelerator().create_op_builder(name).load()


def build_folder(builder_name: str) -> Path | None:
    """Where torch's extension builder puts the op of DeepSpeed's builder `builder_name`; None when DeepSpeed's
    accelerator has no such op (the HPU accelerator has no shared-memory communication op: HCCL communicates)."""
    require_deepspeed()
    from deepspeed.accelerator import get_accelerator  # noqa: PLC0415 -- lazy: deepspeed is optional
    from torch.utils.cpp_extension import _get_build_directory  # noqa: PLC0415 -- lazy: ~0.5 s, with deepspeed only

    builder = get_accelerator().create_op_builder(builder_name)
    if builder is None:
        return None
    return Path(_get_build_directory(builder.name, verbose=False))


def pending_builds(builders: tuple[str, ...] = BUILDERS) -> list[str]:
    """The builders among `builders` whose op a load would still compile: no library yet, or ninja (the one torch
    runs: first on PATH, after `require_deepspeed`) would run a command in its folder."""
    pending = []
    for name in builders:
        folder = build_folder(name)
        if folder is None:
            continue
        if not any(folder.glob("*.so")) or not (folder / "build.ninja").is_file() or _ninja_has_work(folder):
            pending.append(name)
    return pending


def _ninja_has_work(folder: Path) -> bool:
    ninja = shutil.which("ninja")
    if ninja is None:
        return True  # torch cannot load the op without ninja either; the build says why
    dry_run = subprocess.run([ninja, "-n", "-C", str(folder)], capture_output=True, text=True, timeout=60,
                             check=False)
    return dry_run.returncode != 0 or "no work to do" not in dry_run.stdout


def build_announced(builders: tuple[str, ...] = BUILDERS, say: Callable[[str], None] = print) -> list[str]:
    """Build what `pending_builds` finds, in a child process, saying first what and about how long; returns what it
    built. An interrupt (KeyboardInterrupt) stops the compiler as ninja stops on Ctrl-C and is a FitInterrupted with
    one line; objects already finished stay for the next run."""
    pending = pending_builds(builders)
    if not pending:
        return []
    what = " and ".join(OPS.get(name, name) for name in pending)
    where = os.environ.get("TORCH_EXTENSIONS_DIR", "torch's default extensions folder")
    say(f"DeepSpeed compiles {what} before this fit: about {MINUTES} minutes per op (measured on 2 cores), once "
        f"(cached in {where}; `python -m hpu_nb.core.strategies.deepspeed_ops` builds it ahead).")
    command = [sys.executable, "-m", "hpu_nb.core.strategies.deepspeed_ops", *pending]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)  # its own group: the interrupt reaches ninja and the compilers
    try:
        output, _ = child.communicate()
    except BaseException:
        _interrupt(child)
        raise FitInterrupted(
            f"Stopped by you while DeepSpeed compiled {what}: no worker had started; the objects it finished are kept "
            "and the next fit compiles only the rest.") from None
    if child.returncode != 0:
        raise RuntimeError(f"DeepSpeed could not compile {what} (`{' '.join(command)}`):\n{output[-4000:]}")
    return pending


def _interrupt(child: subprocess.Popen[str]) -> None:
    """Ctrl-C for every process of the build's session: ninja and each compiler it started (ninja puts each command
    in a process group of its own); ninja then removes only the half-written outputs and logs the finished ones. Then
    wait; only a build that ignores it for 30 s is killed."""
    for pid in _session_processes(child.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGINT)
    try:
        child.wait(timeout=30)
    except subprocess.TimeoutExpired:
        for pid in _session_processes(child.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        child.wait()


def _session_processes(session: int) -> list[int]:
    """The processes of session `session` (Linux's /proc; elsewhere the session leader's process group)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 3 and fields[3] == str(session):  # after the name: state, ppid, pgrp, session
            found.append(int(entry.name))
    return found or [session]


def main(argv: list[str]) -> int:
    unknown = [name for name in argv if name not in OPS]
    if unknown:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        print(f"builders: {', '.join(OPS)}", file=sys.stderr)
        return 2
    # Ctrl-C is ninja's to handle (it stops its compilers and removes only their half-written outputs): Python waiting
    # on it would kill it 0.25 s after the interrupt (subprocess.run), leaving its compilers running on their own
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        build_ops(tuple(argv) or BUILDERS)
    except RuntimeError as failed:
        print(failed, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

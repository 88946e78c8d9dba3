"""Compile the emulated `hpu` device (hpu_device.cpp) once per torch build and source, and cache the library.

The library links against the torch that is installed, so its cache key is the source plus torch's version and
location. `make setup` builds it; otherwise the first use builds it (about 20 s on two cores) and says so. Two
processes starting together (the ranks of a job) build it once: the second waits on a file lock.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from pathlib import Path

# fcntl, shutil, subprocess, tempfile and time are imported where a build needs them: torch's autoload imports this
# module on every `import torch` only to find the built library (benchmarks/bench_autoload.py).

SOURCE = Path(__file__).with_name("hpu_device.cpp")
CACHE_ENV = "HPU_NB_CACHE_DIR"


class DeviceBuildError(RuntimeError):
    """The emulated hpu device could not be compiled (no C++ compiler, or the compiler failed)."""


def cache_dir() -> Path:
    """Where built libraries live: $HPU_NB_CACHE_DIR, else $XDG_CACHE_HOME/hpu_nb, else ~/.cache/hpu_nb."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hpu_nb"


def _compiler() -> str | None:
    import shutil

    for candidate in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if candidate and shutil.which(candidate):
            return candidate
    return None


def library_path() -> Path:
    """The cached library for this source and this torch (whether it exists yet or not)."""
    import torch

    key = hashlib.sha256()
    key.update(SOURCE.read_bytes())
    key.update(torch.__version__.encode())
    key.update(str(Path(torch.__file__).resolve().parent).encode())
    key.update(sysconfig.get_platform().encode())
    return cache_dir() / f"hpu_device-{key.hexdigest()[:16]}.so"


def compile_command(compiler: str, output: Path) -> list[str]:
    import torch
    from torch.utils import cpp_extension

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    command = [compiler, "-O2", "-shared", "-fPIC", "-std=c++17", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-w"]
    for include in cpp_extension.include_paths():
        command += ["-isystem", include]
    command += [str(SOURCE), "-o", str(output)]
    for lib in cpp_extension.library_paths():
        command += ["-L", lib, f"-Wl,-rpath,{lib}"]
    return command + ["-lc10", "-ltorch_cpu", "-ltorch"]


def build(quiet: bool = False) -> Path:
    """The library's path, compiling it first if this source and torch have none yet."""
    target = library_path()
    if target.exists():
        return target
    import fcntl
    import subprocess
    import tempfile
    import time

    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same library
        if target.exists():
            return target
        compiler = _compiler()
        if compiler is None:
            raise DeviceBuildError(
                "The emulated Gaudi needs a C++ compiler once, to build its `hpu` device for this torch, and none was"
                " found (tried $CXX, c++, g++, clang++). Install one (e.g. `apt install g++`) and run again, or run"
                " `make setup`."
            )
        if not quiet:
            print(f"hpu_nb: building the emulated hpu device for torch {_torch_version()} (once, about 20 s)...",
                  file=sys.stderr, flush=True)
        started = time.monotonic()
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            partial = Path(tmp) / target.name
            result = subprocess.run(compile_command(compiler, partial), capture_output=True, text=True)
            if result.returncode != 0:
                raise DeviceBuildError(
                    f"Building the emulated hpu device failed ({compiler}, exit {result.returncode}):\n"
                    + result.stderr[-4000:]
                )
            os.replace(partial, target)
        if not quiet:
            print(f"hpu_nb: built {target} in {time.monotonic() - started:.0f} s.", file=sys.stderr, flush=True)
    return target


def _torch_version() -> str:
    import torch

    return torch.__version__

"""Compile the emulated `hpu` device (hpu_device.cpp) once per torch build and source, and cache the library.

The library links against the torch that is installed, so its cache key is the source plus torch's version and
location. `make setup` (and Binder's postBuild) build it; otherwise the first use builds it (about 20 s on two cores)
and says so. Two processes starting together (the ranks of a job) build it once: the second waits on a file lock.

A build leaves nothing half-done behind: the compiler writes into a `.partial-*` folder that the next build removes,
and it runs under a guard process that kills the compiler's whole process group when the building process dies
(even by SIGKILL), so no orphaned compiler keeps running. Where the cache directory cannot be written (a read-only
HOME on some clusters) and HPU_NB_CACHE_DIR was not set, the library goes to a per-user folder of the temp directory.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from hpu_nb.runtime.env import CACHE_ENV, cache_dir

# torch is imported where it is needed. The standard modules above are loaded by `import torch` anyway (torch's
# autoload imports this module on every `import torch` to find the built library: benchmarks/bench_autoload.py).

SOURCE = Path(__file__).with_name("hpu_device.cpp")
GUARD_SCRIPT = Path(__file__).with_name("compiler_guard.py")
PARTIAL_PREFIX = ".partial-"
NO_COMPILER_HELP = (
    "Install one and run again: `apt-get install g++` (Debian/Ubuntu), `dnf install gcc-c++` (Fedora/RHEL), or"
    " `conda install -c conda-forge cxx-compiler` in a conda environment; then `python -m hpu_nb.emulator.hpu_device`"
    " builds it once. Only the emulated Gaudi needs it: on a Gaudi (Habana's software) and for the trace viewer"
    " and the rest of hpu_nb, no compiler is needed."
)


class DeviceBuildError(RuntimeError):
    """The emulated hpu device could not be compiled (no C++ compiler, no writable cache, or the compiler failed)."""


def fallback_cache_dir() -> Path:
    """Where the library goes when the default cache directory cannot be written: a per-user temp folder."""
    return Path(tempfile.gettempdir()) / f"hpu_nb-cache-{os.getuid()}"


def _library_dirs() -> list[Path]:
    """Directories that may hold the library, in order: an explicit HPU_NB_CACHE_DIR is the only one."""
    if os.environ.get(CACHE_ENV):
        return [cache_dir()]
    return [cache_dir(), fallback_cache_dir()]


def _compiler() -> str | None:
    for candidate in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if candidate and shutil.which(candidate):
            return candidate
    return None


def library_name() -> str:
    """The library's file name for this source and this torch."""
    import torch  # noqa: PLC0415 -- lazy: torch's autoload imports this module while torch loads

    key = hashlib.sha256()
    key.update(SOURCE.read_bytes())
    key.update(torch.__version__.encode())
    key.update(str(Path(torch.__file__).resolve().parent).encode())
    key.update(sysconfig.get_platform().encode())
    return f"hpu_device-{key.hexdigest()[:16]}.so"


# Beside each library, a record of its size and SHA-256 written when the build finished. A library cut short (a full
# disk, a copy interrupted) would crash the interpreter with SIGBUS when loaded, and torch's autoload loads it at every
# `import torch`: a library whose size is not the recorded one (one stat and a small read) is never loaded, and the
# next use rebuilds it. `python -m hpu_nb.emulator.hpu_device` checks the whole SHA-256 and that it loads.
RECORD_SUFFIX = ".record"


def record_path(library: Path) -> Path:
    return library.with_name(library.name + RECORD_SUFFIX)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_record(library: Path) -> None:
    partial = record_path(library).with_name(f"{PARTIAL_PREFIX}{os.getpid()}-{library.name}{RECORD_SUFFIX}")
    partial.write_text(f"{library.stat().st_size} {_sha256(library)}\n")
    os.replace(partial, record_path(library))


def _read_record(library: Path) -> tuple[int, str] | None:
    try:
        size, digest = record_path(library).read_text().split()
        return int(size), digest
    except (OSError, ValueError):
        return None


def library_is_intact(library: Path, check_digest: bool = False) -> bool:
    """Whether `library` is as its build left it: its recorded size (and, if asked, its SHA-256)."""
    record = _read_record(library)
    try:
        size = library.stat().st_size
    except OSError:
        return False
    if record is None or record[0] != size:
        return False
    return not check_digest or _sha256(library) == record[1]


def discard_library(library: Path) -> None:
    """Remove a library that is not intact (and its record), so the next use builds it anew."""
    for path in (library, record_path(library)):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def load_in_child(library: Path) -> str:
    """Load `library` in a fresh interpreter (a bad library may kill the process that loads it); "" if it loads, else
    what went wrong."""
    code = "import sys, torch; torch.ops.load_library(sys.argv[1])"
    env = {**os.environ, "HPU_NB_AUTOLOAD": "0"}
    result = subprocess.run([sys.executable, "-c", code, str(library)], capture_output=True, text=True, env=env,
                            timeout=300, check=False)
    if result.returncode == 0:
        return ""
    lines = result.stderr.strip().splitlines()
    return lines[-1] if lines else f"the interpreter ended with {result.returncode}"


def library_path() -> Path:
    """The cached library for this source and this torch: where it is built, else where a build would put it first."""
    name = library_name()
    primary = cache_dir() / name
    if primary.exists() or os.environ.get(CACHE_ENV):  # the usual case costs one stat (torch's autoload asks)
        return primary
    fallback = fallback_cache_dir() / name
    return fallback if fallback.exists() else primary


# ATen.h states the C++ standard it needs: `#if !defined(_MSC_VER) && __cplusplus < 202002L` / `#error C++20 ...`
# from torch 2.14 (C++17 before). The build asks the installed headers rather than a table of torch versions.
_REQUIRED_STANDARD = re.compile(r"__cplusplus\s*<\s*(\d{6})L")
_STANDARDS = {201703: "c++17", 202002: "c++20", 202302: "c++23"}


def cxx_standard() -> str:
    """The C++ standard the installed torch's headers require (`-std=` value): C++17 unless ATen.h asks for more."""
    required = 201703
    for include in _cpp_extension().include_paths():
        header = Path(include) / "ATen" / "ATen.h"
        if header.is_file():
            for match in _REQUIRED_STANDARD.finditer(header.read_text(errors="replace")):
                required = max(required, int(match.group(1)))
            break
    known = [value for value in sorted(_STANDARDS) if value >= required]
    return _STANDARDS[known[0]] if known else f"c++{str(required)[2:4]}"


def _cpp_extension() -> ModuleType:
    """torch.utils.cpp_extension, imported without its import-time warning on a CUDA build without the CUDA toolkit
    ("No CUDA runtime is found, using CUDA_HOME=..."): the emulated device is a CPU library and needs none."""
    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        from torch.utils import cpp_extension  # noqa: PLC0415 -- lazy: costs ~0.5 s, only a build needs it
    finally:
        logger.setLevel(level)
    return cpp_extension


def compile_command(compiler: str, output: Path) -> list[str]:
    import torch  # noqa: PLC0415 -- lazy: torch's autoload imports this module while torch loads

    cpp_extension = _cpp_extension()

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    command = [compiler, "-O2", "-shared", "-fPIC", f"-std={cxx_standard()}", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-w"]
    for include in cpp_extension.include_paths():
        command += ["-isystem", include]
    command += [str(SOURCE), "-o", str(output)]
    for lib in cpp_extension.library_paths():
        command += ["-L", lib, f"-Wl,-rpath,{lib}"]
    return command + ["-lc10", "-ltorch_cpu", "-ltorch"]


# The torch releases the emulated device is tested with, CPU and CUDA builds (`make test-torch-builds`; the README's
# "The torch you have"): Intel Gaudi 1.22's torch (2.7) to PyPI's newest when it was last measured.
OLDEST_TESTED_TORCH = (2, 7)
NEWEST_TESTED_TORCH = (2, 15)


def torch_release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string ("2.14.1+cu130" -> (2, 14))."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise DeviceBuildError(f"torch's version {version!r} is not one hpu_nb can read")
    return int(match.group(1)), int(match.group(2))


def check_torch_release(version: str) -> None:
    """Refuse a torch older than the tested range (its C++ API differs); warn once, and build, for a newer one."""
    release = torch_release(version)
    oldest, newest = (".".join(map(str, r)) for r in (OLDEST_TESTED_TORCH, NEWEST_TESTED_TORCH))
    if release < OLDEST_TESTED_TORCH:
        raise DeviceBuildError(
            f"The emulated Gaudi needs torch {oldest} or newer (tested: {oldest} to {newest}, CPU and CUDA builds);"
            f" this is torch {version}. Upgrade it (`pip install 'torch>={oldest}'`), or use a Gaudi, whose own"
            " torch hpu_nb runs on as it is."
        )
    if release > NEWEST_TESTED_TORCH:
        warnings.warn(
            f"torch {version} is newer than the releases the emulated Gaudi is tested with ({oldest} to {newest}):"
            " the device is built for it and should work; if something fails, torch "
            f"{newest} is the newest known to.", stacklevel=3,
        )


def build(quiet: bool = False) -> Path:
    """The library's path, compiling it first if this source and torch have none yet."""
    check_torch_release(_torch_version())
    target = library_path()
    if library_is_intact(target):
        return target
    compiler = _compiler()
    if compiler is None:
        raise DeviceBuildError(
            "The emulated Gaudi needs a C++ compiler once, to build its `hpu` device for this torch, and none was"
            f" found (tried $CXX, c++, g++, clang++). {NO_COMPILER_HELP}"
        )
    directory, lock = _open_writable_dir()
    target = directory / target.name
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building in this directory
        if library_is_intact(target):
            return target
        if target.exists():
            why = "has no build record" if _read_record(target) is None else "is not as its build left it (cut short?)"
            print(f"hpu_nb: the emulated device's library {target} {why}: building it again.", file=sys.stderr,
                  flush=True)
            discard_library(target)
        _remove_partial_builds(directory)  # left by a build that was killed: nobody else builds while we hold the lock
        if not quiet:
            print(f"hpu_nb: building the emulated hpu device for torch {_torch_version()} (once, about 20 s)...",
                  file=sys.stderr, flush=True)
        started = time.monotonic()
        partial = Path(_make_partial_dir(directory)) / target.name
        try:
            returncode, stderr = _run_guarded(compile_command(compiler, partial))
            if returncode != 0:
                raise DeviceBuildError(
                    f"Building the emulated hpu device failed ({compiler}, exit {returncode}):\n" + stderr[-4000:]
                )
            os.replace(partial, target)
            _write_record(target)
        finally:
            _remove_tree(partial.parent)
        if not quiet:
            print(f"hpu_nb: built {target} in {time.monotonic() - started:.0f} s.", file=sys.stderr, flush=True)
    return target


def _open_writable_dir() -> tuple[Path, object]:
    """The first library directory we can write to, with its lock file open; else a DeviceBuildError saying why."""
    failures = []
    for directory in _library_dirs():
        try:
            directory.mkdir(parents=True, exist_ok=True)
            lock = open(directory / ".build.lock", "a")  # noqa: SIM115 -- held open (locked) until the build ends
        except OSError as err:
            failures.append(f"{directory}: {err.strerror or err}")
            continue
        if directory != cache_dir():
            print(f"hpu_nb: the cache directory {cache_dir()} cannot be written ({failures[0]}); the emulated device is"
                  f" built in {directory} instead. Set {CACHE_ENV} to a writable directory to keep it across reboots.",
                  file=sys.stderr, flush=True)
        return directory, lock
    raise DeviceBuildError(
        "The emulated Gaudi's `hpu` device must be built once into a writable directory, and none could be written ("
        + "; ".join(failures) + f"). Set {CACHE_ENV} to a writable directory (e.g. `export {CACHE_ENV}=$PWD/.hpu_nb`)."
    )


def _make_partial_dir(directory: Path) -> str:
    return tempfile.mkdtemp(prefix=f"{PARTIAL_PREFIX}{os.getpid()}-", dir=directory)


def _remove_partial_builds(directory: Path) -> None:
    for leftover in directory.glob(f"{PARTIAL_PREFIX}*"):
        _remove_tree(leftover)


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _run_guarded(command: list[str]) -> tuple[int, str]:
    """Run the compiler under a guard process (compiler_guard.py, run as a script) that dies with us and takes the
    compiler's whole process group (driver, cc1plus, as, ld) with it. On an exception here (Ctrl-C) the guard is
    stopped too."""
    guard = subprocess.Popen(
        [sys.executable, "-S", str(GUARD_SCRIPT), str(os.getpid()), *command],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=_die_with_parent_hook(),
    )
    try:
        _, stderr = guard.communicate()
    except BaseException:
        guard.send_signal(signal.SIGTERM)
        guard.wait()
        raise
    return guard.returncode, stderr


def _die_with_parent_hook() -> Callable[[], None] | None:
    """For the guard, before exec: receive SIGTERM when the building process dies (Linux's PR_SET_PDEATHSIG). libc is
    looked up here, in the parent: the forked child only makes the call (no dlopen between fork and exec)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: the guard still stops the compiler on a Ctrl-C
        return None
    return lambda: prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG = 1


def _torch_version() -> str:
    import torch  # noqa: PLC0415 -- lazy: torch's autoload imports this module while torch loads

    return torch.__version__


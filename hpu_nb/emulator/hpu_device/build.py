"""Compile the emulated `hpu` device (hpu_device.cpp) once per torch build and source, and cache the library.

The library links against the torch that is installed, so its cache key is the source plus torch's version and
location. `make setup` (and Binder's postBuild) build it; otherwise the first use builds it (about 20 s on two cores)
and says so. Two processes starting together (the ranks of a job) build it once: the second waits on a file lock.

A build leaves nothing half-done behind: the compiler writes into a `.partial-*` folder that the next build removes,
and it runs under a guard process that kills the compiler's whole process group when the building process dies
(even by SIGKILL), so no orphaned compiler keeps running. The library is code every `import torch` runs, so it is
kept, looked for and loaded only in a folder no other user can write (hpu_nb.runtime.cache: the cache directory when
it is yours alone, else a private folder of the temp directory, never one under a name someone could take first). A
team's prebuilt library is used read-only, through a private copy checked against a digest the user names
(HPU_NB_SHARED_LIBRARY / HPU_NB_SHARED_LIBRARY_SHA256).
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
from typing import IO

from hpu_nb.runtime import cache
from hpu_nb.runtime.env import CACHE_ENV, cache_dir
from hpu_nb.runtime.files import check_named_file

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
# disk, a copy interrupted) or changed in place (64 KiB of zeros, same size) would crash the interpreter (SIGBUS,
# SIGSEGV) when loaded, and torch's autoload loads it at every `import torch`: a library whose bytes are not the
# recorded ones is never loaded, and the next use rebuilds it. Hashing the whole file at every `import torch` is what
# a stamp avoids: beside the record, the file's identity when its SHA-256 was last checked (device, inode, size,
# mtime, ctime; any write changes ctime, which only root can set back); while the file still has that identity, its
# bytes are the checked ones, so the full hash runs once per change (benchmarks/bench_autoload.py).
RECORD_SUFFIX = ".record"
STAMP_SUFFIX = ".verified"


def record_path(library: Path) -> Path:
    return library.with_name(library.name + RECORD_SUFFIX)


def stamp_path(library: Path) -> Path:
    return library.with_name(library.name + STAMP_SUFFIX)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_small(target: Path, text: str, what: str) -> None:
    """Write `text` to `target` atomically (a `.partial-*` file renamed over it); on failure (a full disk) remove the
    partial file and raise DeviceBuildError saying what, where, and how much room is left."""
    partial = target.with_name(f"{PARTIAL_PREFIX}{os.getpid()}-{target.name}")
    try:
        with open(partial, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())  # a full disk says so here, not later, on some file systems
        os.replace(partial, target)
    except OSError as err:
        with contextlib.suppress(OSError):
            partial.unlink()
        free = "unknown"
        with contextlib.suppress(OSError):
            free = f"{shutil.disk_usage(target.parent).free:,} bytes"
        raise DeviceBuildError(
            f"Writing the emulated device's {what} {target} failed: {err.strerror or err} (free space on that file"
            f" system: {free}). Make room there, or set {CACHE_ENV} to a private folder with room, and run again."
        ) from err


def _stamp(info: os.stat_result) -> str:
    return f"{info.st_dev} {info.st_ino} {info.st_size} {info.st_mtime_ns} {info.st_ctime_ns}"


def _write_record(library: Path, digest: str | None = None) -> None:
    """The build record (size, SHA-256) and the stamp of the file so checked."""
    info = os.stat(library)
    digest = digest or _sha256(library)
    _write_small(record_path(library), f"{info.st_size} {digest}\n", "build record")
    _write_stamp(library, info, digest)


def _write_stamp(library: Path, info: os.stat_result, digest: str) -> None:
    with contextlib.suppress(DeviceBuildError):  # only saves a later hash: a full disk costs nothing else
        _write_small(stamp_path(library), f"{_stamp(info)} {digest}\n", "checked-library stamp")


def _read_record(library: Path) -> tuple[int, str] | None:
    try:
        size, digest = record_path(library).read_text().split()
        return int(size), digest
    except (OSError, ValueError):
        return None


def library_problem(library: Path, check_digest: bool = False) -> str | None:
    """Why `library` must not be loaded ("has no build record", "is not the library its build recorded", "lies in a
    folder ..."), None when it is as its build left it, in a folder and file only you can write. Its SHA-256 is
    compared with the record's once per change of the file (the stamp), or always with `check_digest`."""
    problem = cache.folder_problem(library.parent)
    if problem is not None:
        return f"lies in a folder that {problem}" if not problem.startswith("lies in") else problem
    problem = cache.file_problem(library)
    if problem is not None:
        return problem
    record = _read_record(library)
    if record is None:
        return "has no build record"
    try:
        info = os.stat(library)
    except OSError as err:
        return f"cannot be read ({err.strerror or err})"
    if record[0] != info.st_size:
        return f"is not as its build left it (cut short? {info.st_size:,} bytes, its record says {record[0]:,})"
    if not check_digest and cache.file_problem(stamp_path(library)) is None:
        with contextlib.suppress(OSError):
            if stamp_path(library).read_text() == f"{_stamp(info)} {record[1]}\n":
                return None
    try:
        digest = _sha256(library)
    except OSError as err:
        return f"cannot be read ({err.strerror or err})"
    if digest != record[1]:
        return "is not the library its build recorded (its SHA-256 differs: changed or damaged since)"
    _write_stamp(library, info, digest)
    return None


def library_is_intact(library: Path, check_digest: bool = False) -> bool:
    """Whether `library` may be loaded: library_problem() finds nothing."""
    return library_problem(library, check_digest) is None


def discard_library(library: Path) -> None:
    """Remove a library that is not intact (and its record and stamp), so the next use builds it anew."""
    for path in (library, record_path(library), stamp_path(library)):
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
    """The cached library for this source and this torch: where it is built (in a folder only you can write), else
    where a build would put it first. The usual case costs a few stats (torch's autoload asks at every import)."""
    name = library_name()
    for folder in cache.code_dirs():
        if (folder / name).exists():
            return folder / name
    return cache_dir() / name


SHARED_LIBRARY_ENV = "HPU_NB_SHARED_LIBRARY"  # a team's prebuilt library (or a folder of them), used read-only
SHARED_DIGEST_ENV = "HPU_NB_SHARED_LIBRARY_SHA256"  # its SHA-256 (several: comma-separated), from outside that folder
_HEX64 = re.compile(r"[0-9a-f]{64}")
_said: set[str] = set()


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        print(f"hpu_nb: {message}", file=sys.stderr, flush=True)


def shared_library() -> Path | None:
    """Your private copy of the team's library that HPU_NB_SHARED_LIBRARY names, made now if needed and used only
    when its SHA-256 is one HPU_NB_SHARED_LIBRARY_SHA256 lists; None (with a message) when none is named or it
    cannot be used. The shared file is only read: a folder others write cannot change what runs, because the copy
    is hashed as it is written into a folder only you can write, and loaded from there."""
    named = os.environ.get(SHARED_LIBRARY_ENV, "").strip()
    if not named:
        return None
    name = library_name()
    source = Path(named).expanduser()
    if source.is_dir():
        source = source / name
    elif source.name != name:
        _say_once(f"{SHARED_LIBRARY_ENV}={named!r} is not the library this torch and this hpu_nb need ({name}: the"
                  " name holds their digest); not used. Build that one where the team's libraries are built (`python"
                  " -m hpu_nb.emulator.hpu_device`).")
        return None
    expected = {d.lower() for d in re.split(r"[\s,]+", os.environ.get(SHARED_DIGEST_ENV, "").strip()) if d}
    if not expected or not all(_HEX64.fullmatch(d) for d in expected):
        _say_once(f"{SHARED_LIBRARY_ENV} is set but {SHARED_DIGEST_ENV} does not name its SHA-256 (64 hex digits;"
                  " from your team's own channel, not from the shared folder): the shared library is not used.")
        return None
    try:
        check_named_file(source, SHARED_LIBRARY_ENV)  # a regular file (not a FIFO to wait on, nor a device)
        directory, _ = cache.writable_code_dir()
        target = directory / name
        partial = directory / f"{PARTIAL_PREFIX}{os.getpid()}-{name}"
        digest = hashlib.sha256()
        with open(source, "rb") as src, open(partial, "xb") as dst:
            for block in iter(lambda: src.read(1 << 20), b""):
                digest.update(block)
                dst.write(block)
        if digest.hexdigest() not in expected:
            partial.unlink()
            _say_once(f"the shared library {source} has SHA-256 {digest.hexdigest()}, not the one"
                      f" {SHARED_DIGEST_ENV} names: not used (changed since it was published?).")
            return None
        os.chmod(partial, 0o755)
        os.replace(partial, target)
        _write_record(target, digest.hexdigest())
    except (OSError, DeviceBuildError) as err:
        with contextlib.suppress(OSError, UnboundLocalError):
            partial.unlink()
        _say_once(f"the shared library {source} could not be used: {err}")
        return None
    return target


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
    shared = shared_library()  # a team's prebuilt library, when one is named and is as published
    if shared is not None:
        return shared
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
        why = library_problem(target)
        if why is None:
            return target
        if target.exists():
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
            try:
                _write_record(target)
            except DeviceBuildError:
                discard_library(target)  # a library without its record is never loaded: leave neither
                raise
        finally:
            _remove_tree(partial.parent)
        if not quiet:
            print(f"hpu_nb: built {target} in {time.monotonic() - started:.0f} s.", file=sys.stderr, flush=True)
    return target


def _open_writable_dir() -> tuple[Path, IO[str]]:
    """The private folder to build in (hpu_nb.runtime.cache), with its lock file open; else a DeviceBuildError."""
    try:
        directory, note = cache.writable_code_dir()
        lock = open(directory / ".build.lock", "a")  # noqa: SIM115 -- held open (locked) until the build ends
    except OSError as err:
        raise DeviceBuildError(
            f"The emulated Gaudi's `hpu` device must be built once into a writable directory, and none could be written"
            f" ({err}). Set {CACHE_ENV} to a writable directory (e.g. `export {CACHE_ENV}=$PWD/.hpu_nb`)."
        ) from err
    if note is not None:
        print(f"hpu_nb: {note}; the emulated device is built in {directory} instead. Set {CACHE_ENV} to a writable"
              " directory of yours to keep it across reboots.", file=sys.stderr, flush=True)
    return directory, lock


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


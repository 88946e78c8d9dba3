"""Caches you can trust (issue 35, items 1-4 and the full disk): hpu_nb runs no code another user could have written
into its cache, and a damaged cache file is rebuilt, never run.

The two code-execution cases plant their files as a second user (uid 65534, `setpriv` as root), as a neighbour on a
shared Gaudi login node would; they are skipped, saying why, where the tests do not run as root with setpriv.
"""

from __future__ import annotations

import builtins
import errno
import hashlib
import importlib.util
import marshal
import os
import random
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpu_nb.emulator.hpu_device import build
from hpu_nb.runtime import cache
from hpu_nb.wiring import flavours

REPO = Path(__file__).resolve().parents[2]
FAKE_CXX = REPO / "tests" / "install_checks" / "fake_cxx.sh"
OTHER_UID = 65534  # "nobody": the neighbour
SETPRIV = shutil.which("setpriv")
AS_ROOT = os.geteuid() == 0
needs_second_user = pytest.mark.skipif(not (AS_ROOT and SETPRIV),
                                       reason="planting files as a second user needs root and setpriv")


def as_other_user(command: str) -> None:
    """Run the shell `command` as uid/gid 65534 with no extra groups."""
    subprocess.run([SETPRIV, f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups", "sh", "-c", command],
                   check=True, timeout=60)


@pytest.fixture
def open_base() -> Iterator[Path]:
    """A folder the second user can reach (pytest's tmp_path is private to us): root's, mode 0755."""
    base = Path(tempfile.mkdtemp(prefix="hpu_nb-trust-test-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPU_NB_", "PT_HPU", "XDG_CACHE"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = str(REPO)
    return {**env, **extra}


# -- the rules ---------------------------------------------------------------------------------------------------------
def test_a_folder_only_you_can_write_is_trusted_and_any_other_is_refused_saying_why(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    assert cache.folder_problem(private) is None
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o1777)  # what a team sets for a shared cache
    assert cache.folder_problem(team) == "can be written by other users (mode 1777)"
    inside = team / "mine"
    inside.mkdir(mode=0o700)
    assert cache.folder_problem(inside) is None  # sticky: nobody else can rename or replace it
    team.chmod(0o777)
    assert "which other users can write (mode 777), so they could replace it" in str(cache.folder_problem(inside))
    assert cache.folder_problem(tmp_path / "missing").startswith("cannot be read")


@pytest.mark.skipif(not AS_ROOT, reason="giving a folder to another user needs root")
def test_a_folder_of_another_user_is_refused_and_so_is_what_lies_in_it(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o755)
    os.chown(foreign, OTHER_UID, OTHER_UID)
    assert cache.folder_problem(foreign).startswith(f"is owned by nobody (uid {OTHER_UID}), not by you")
    inside = foreign / "mine"
    inside.mkdir(mode=0o700)
    assert cache.folder_problem(inside).startswith(f"lies in {foreign}, owned by nobody (uid {OTHER_UID})")


def test_a_shared_cache_is_refused_once_with_what_to_do_and_a_fresh_private_folder_is_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    shared = tmp_path / "team-cache"
    shared.mkdir()
    shared.chmod(0o1777)
    temp = tmp_path / "tmp"
    temp.mkdir(mode=0o700)
    monkeypatch.setenv("HPU_NB_CACHE_DIR", str(shared))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.setattr(cache, "_said", set())
    folder, note = cache.writable_code_dir()
    assert folder.parent == temp and folder.name.startswith(f"hpu_nb-cache-{os.geteuid()}-")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and note is not None and str(shared) in note
    assert cache.writable_code_dir()[0] == folder  # found again (yours, private), not one per call
    assert list(cache.code_dirs()) == [folder]  # the shared folder is never looked in for code
    said = capsys.readouterr().err
    assert said.count("hpu_nb: the cache folder") == 1 and f"{shared} can be written by other users" in said
    assert "set HPU_NB_CACHE_DIR to a private folder" in said and "HPU_NB_SHARED_LIBRARY" in said


def test_a_cache_folder_hpu_nb_makes_is_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPU_NB_CACHE_DIR", str(tmp_path / "new" / "cache"))
    folder, note = cache.writable_code_dir()
    assert folder == tmp_path / "new" / "cache" and note is None
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


# -- item 1: bytecode another user wrote ------------------------------------------------------------------------------
PLANTED_IMPORT = "import pytorch_lightning; import hpu_nb.pytorch_lightning as p; p.HPUAccelerator; print('imported')"


def _planted_bytecode(module: str, relative: str, marker: Path) -> tuple[str, bytes]:
    """(cache file name, bytes) of a translation of hpu_nb/`relative` that also writes `marker`, in the cache format
    hpu_nb 665affe read without a check (magic number + marshal)."""
    path = flavours.PACKAGE_ROOT / relative
    source = path.read_bytes()
    digest = hashlib.blake2b(source + repr(flavours._RULES).encode(), digest_size=12).hexdigest()
    code = compile(flavours.translate(source.decode()) + f"\nopen({str(marker)!r}, 'w').write('planted')\n",
                   str(path), "exec")
    return (f"{module}.{digest}.{sys.implementation.cache_tag}.bin",
            importlib.util.MAGIC_NUMBER + marshal.dumps(code))


@needs_second_user
@pytest.mark.parametrize("owner", ["team folder, mode 1777", "the other user's folder"])
def test_bytecode_another_user_planted_in_the_cache_is_never_run(open_base: Path, owner: str) -> None:
    shared = open_base / "cache"
    shared.mkdir()
    shared.chmod(0o1777)
    marker = open_base / "planted-code-ran"
    planted = open_base / "planted"
    planted.mkdir(mode=0o755)
    for module, relative in (("hpu_nb._standalone.core", "core/__init__.py"),
                             ("hpu_nb._standalone.core.accelerator", "core/accelerator.py")):
        name, data = _planted_bytecode(module, relative, marker)
        (planted / name).write_bytes(data)
    folder = shared
    if not owner.startswith("team"):
        folder = open_base / "theirs"
        folder.mkdir(mode=0o755)
        os.chown(folder, OTHER_UID, OTHER_UID)
    as_other_user(f"mkdir -m 777 {folder / flavours.BYTECODE_DIR}"
                  f" && cp {planted}/*.bin {folder / flavours.BYTECODE_DIR}/")
    result = subprocess.run([sys.executable, "-c", PLANTED_IMPORT], capture_output=True, text=True, timeout=600,
                            env=_env(HPU_NB_CACHE_DIR=str(folder), TMPDIR=str(open_base)), check=False)
    assert result.returncode == 0 and "imported" in result.stdout, result.stderr[-3000:]
    assert not marker.exists(), "the planted bytecode ran"
    assert result.stderr.count(f"hpu_nb: the cache folder {folder} ") == 1, result.stderr[-3000:]


# -- item 2: the temp-folder fallback ---------------------------------------------------------------------------------
CONSTRUCTOR = """
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen("%s", "w");
    if (f) { fputs("planted library ran", f); fclose(f); }
}
"""


def _plant_library(folder_as_other: Path, open_base: Path, marker: Path) -> None:
    """As the other user: a library under the name this torch computes, whose constructor writes `marker`, with the
    record (size, SHA-256) and the stamp hpu_nb writes beside its own."""
    compiler = next((c for c in ("cc", "gcc", "c++", "g++") if shutil.which(c)), None)
    if compiler is None:
        pytest.skip("no C compiler to make the planted library")
    source = open_base / "planted.c"
    source.write_text(CONSTRUCTOR % marker)
    library = open_base / build.library_name()
    subprocess.run([compiler, "-shared", "-fPIC", "-x", "c", str(source), "-o", str(library)], check=True,
                   timeout=120)
    data = library.read_bytes()
    record = open_base / "planted.record"
    record.write_text(f"{len(data)} {hashlib.sha256(data).hexdigest()}\n")
    as_other_user(f"mkdir -p -m 755 {folder_as_other} && cp {library} {folder_as_other}/"
                  f" && cp {record} {folder_as_other}/{library.name}{build.RECORD_SUFFIX}")


@needs_second_user
@pytest.mark.parametrize("home", ["read-only HOME", "writable HOME, device not built yet"])
def test_a_library_another_user_planted_in_the_temp_folder_is_never_loaded_at_import_torch(
        open_base: Path, home: str) -> None:
    temp = open_base / "tmp"
    temp.mkdir()
    temp.chmod(0o1777)  # as /tmp
    marker = open_base / "planted-library-ran"
    for folder in (temp / f"hpu_nb-cache-{os.geteuid()}", temp / f"hpu_nb-cache-{os.geteuid()}-a1b2c3"):
        _plant_library(folder, open_base, marker)  # 665affe's name, and the names hpu_nb now makes
    if home.startswith("read-only"):
        cache_home = open_base / "not-a-folder"
        cache_home.write_text("mkdir fails here, as on a read-only HOME")
    else:
        cache_home = open_base / "xdg"
        cache_home.mkdir(mode=0o700)
    code = "import torch, sys; print(torch.ones(2).sum().item(), sys.modules['hpu_nb.emulator.hpu_device']._library)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env=_env(XDG_CACHE_HOME=str(cache_home), TMPDIR=str(temp)), check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not marker.exists(), "the planted library's constructor ran at import torch"
    assert result.stdout.split() == ["2.0", "None"], result.stdout


# -- item 3: a damaged bytecode file ----------------------------------------------------------------------------------
def test_a_damaged_bytecode_file_is_never_given_to_marshal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPU_NB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    source = tmp_path / "example.py"
    source.write_text("VALUE = 'lightning.pytorch'\n")
    flavours.translated_code(source, "hpu_nb._standalone.core.example")
    (cached,) = (tmp_path / "cache" / flavours.BYTECODE_DIR).glob("*.bin")
    data = bytearray(cached.read_bytes())
    data[-3] ^= 0x40  # one flipped bit in the marshalled code
    cached.write_bytes(bytes(data))
    loaded = []
    real_loads = marshal.loads
    monkeypatch.setattr(flavours.marshal, "loads", lambda b: loaded.append(b) or real_loads(b))
    code = flavours.translated_code(source, "hpu_nb._standalone.core.example")
    assert loaded == [] and "pytorch_lightning" in code.co_consts  # compiled again, the damaged bytes never read
    assert cached.read_bytes() != bytes(data)  # and written anew
    assert flavours.translated_code(source, "hpu_nb._standalone.core.example").co_consts == code.co_consts
    assert len(loaded) == 1  # the rewritten file is read back


def test_the_standalone_flavours_bytecode_after_bit_flips_is_rebuilt_not_run(tmp_path: Path) -> None:
    """A fresh interpreter fills the cache; bits are flipped in every file's marshalled code (one in a module name where
    there is one, which marshal reads without complaint; else eight at random, one seed a file); the next interpreter
    (a crash there is a failure here, not a dead worker) compiles them again and rewrites them."""
    env = _env(HPU_NB_CACHE_DIR=str(tmp_path))
    first = subprocess.run([sys.executable, "-c", PLANTED_IMPORT], capture_output=True, text=True, timeout=600,
                           env=env, check=False)
    assert first.returncode == 0, first.stderr[-3000:]
    files = sorted((tmp_path / flavours.BYTECODE_DIR).glob("*.bin"))
    assert len(files) > 3
    damaged = {}
    for seed, path in enumerate(files):
        data = bytearray(path.read_bytes())
        name = data.find(b"pytorch_lightning", len(data) // 4)
        if name >= 0:  # one bit that marshal cannot see: the code would import `qytorch_lightning`
            data[name] ^= 0x01
        else:  # bits anywhere in the marshalled code (its last three quarters), past the header
            rng = random.Random(seed)
            for _ in range(8):
                data[rng.randrange(len(data) // 4, len(data))] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))
        damaged[path] = bytes(data)
    again = subprocess.run([sys.executable, "-c", PLANTED_IMPORT], capture_output=True, text=True, timeout=600,
                           env=env, check=False)
    assert again.returncode == 0 and "imported" in again.stdout, again.stderr[-3000:]  # was SIGSEGV / SystemError
    rewritten = [path for path, data in damaged.items() if path.exists() and path.read_bytes() != data]
    assert rewritten == list(damaged)  # every module was compiled again and its file written anew


# -- item 4: a library damaged without changing its size --------------------------------------------------------------
@pytest.fixture
def library_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private cache holding a copy of this torch's built library and its record (never the shared cache)."""
    built = build.build(quiet=True)
    cache_folder = tmp_path / "cache"
    cache_folder.mkdir(mode=0o700)
    monkeypatch.setenv("HPU_NB_CACHE_DIR", str(cache_folder))
    shutil.copy2(built, cache_folder / built.name)
    shutil.copy2(build.record_path(built), build.record_path(cache_folder / built.name))
    return cache_folder / built.name


def _zero_the_middle(library: Path) -> None:
    """64 KiB of zeros written into the middle, size and mtime kept (only the inode's ctime tells)."""
    before = library.stat()
    with open(library, "r+b") as out:
        out.seek(before.st_size // 2 - 32 * 1024)
        out.write(b"\0" * 64 * 1024)
    os.utime(library, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert library.stat().st_size == before.st_size


def test_a_library_damaged_in_place_is_found_though_its_size_and_mtime_are_the_records(library_copy: Path) -> None:
    assert build.library_is_intact(library_copy)  # the full hash, once: the stamp is written
    assert build.stamp_path(library_copy).exists()
    assert build.library_is_intact(library_copy)  # the stamp says it is the checked file
    _zero_the_middle(library_copy)
    assert build.library_problem(library_copy) == ("is not the library its build recorded (its SHA-256 differs:"
                                                   " changed or damaged since)")


def test_import_torch_survives_a_library_zeroed_in_the_middle_and_says_so(library_copy: Path) -> None:
    code = "import torch, sys; print(torch.ones(2).sum().item(), sys.modules['hpu_nb.emulator.hpu_device']._library)"
    env = _env(HPU_NB_CACHE_DIR=str(library_copy.parent))
    fine = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                          check=False)
    assert fine.returncode == 0 and fine.stdout.split() == ["2.0", str(library_copy)], fine.stderr[-2000:]
    _zero_the_middle(library_copy)
    damaged = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                             check=False)
    assert damaged.returncode == 0, damaged.stderr[-2000:]  # was: SIGSEGV, no message
    assert damaged.stdout.split() == ["2.0", "None"]  # not loaded
    assert (f"hpu_nb: the emulated device's library {library_copy} is not the library its build recorded"
            in damaged.stderr and "the first use of `hpu` builds it again" in damaged.stderr)


# -- the team's read-only library -------------------------------------------------------------------------------------
@pytest.fixture
def team_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A team folder (mode 1777) holding a library under this torch's name; a private, empty cache of ours; and a
    compiler that fails, so any build would show."""
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o1777)
    library = team / build.library_name()
    library.write_bytes(b"the team's prebuilt library\n")
    monkeypatch.setenv("HPU_NB_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("CXX", str(FAKE_CXX))
    monkeypatch.setenv("FAKE_CXX_MODE", "fail")
    monkeypatch.setattr(build, "_said", set())
    return library


def test_a_team_library_is_used_through_a_private_copy_checked_against_the_digest_you_name(
        team_library: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPU_NB_SHARED_LIBRARY", str(team_library.parent))
    monkeypatch.setenv("HPU_NB_SHARED_LIBRARY_SHA256", hashlib.sha256(team_library.read_bytes()).hexdigest().upper())
    used = build.build(quiet=True)
    assert used.parent == Path(os.environ["HPU_NB_CACHE_DIR"]) and used.read_bytes() == team_library.read_bytes()
    assert build.library_is_intact(used, check_digest=True) and build.library_path() == used
    team_library.write_bytes(b"changed in the team folder later\n")  # the private copy is what runs
    assert build.build(quiet=True) == used and build.library_is_intact(used, check_digest=True)


def test_a_team_library_without_the_digest_or_with_another_is_not_used(
        team_library: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HPU_NB_SHARED_LIBRARY", str(team_library))
    assert build.shared_library() is None
    assert "HPU_NB_SHARED_LIBRARY_SHA256 does not name its SHA-256" in capsys.readouterr().err
    monkeypatch.setenv("HPU_NB_SHARED_LIBRARY_SHA256", "0" * 64)
    with pytest.raises(build.DeviceBuildError, match="fake failure"):  # not used: built privately instead
        build.build(quiet=True)
    said = capsys.readouterr().err
    assert f"the shared library {team_library} has SHA-256 {hashlib.sha256(team_library.read_bytes()).hexdigest()}"\
           f", not the one HPU_NB_SHARED_LIBRARY_SHA256 names: not used" in said
    assert not any(p.name.startswith(build.PARTIAL_PREFIX) for p in Path(os.environ["HPU_NB_CACHE_DIR"]).iterdir())
    monkeypatch.setenv("HPU_NB_SHARED_LIBRARY", str(team_library.with_name("hpu_device-other.so")))
    assert build.shared_library() is None
    assert "is not the library this torch and this hpu_nb need" in capsys.readouterr().err


def test_import_torch_loads_a_verified_team_library(tmp_path: Path) -> None:
    built = build.build(quiet=True)
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o1777)
    shutil.copy(built, team / built.name)
    digest = hashlib.sha256(built.read_bytes()).hexdigest()
    code = "import torch, sys; print(sys.modules['hpu_nb.emulator.hpu_device']._library)"
    mine, temp = tmp_path / "mine", tmp_path / "tmp"
    temp.mkdir(mode=0o700)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False,
                            env=_env(HPU_NB_CACHE_DIR=str(mine), HPU_NB_SHARED_LIBRARY=str(team), TMPDIR=str(temp),
                                     HPU_NB_SHARED_LIBRARY_SHA256=digest))
    assert result.returncode == 0 and result.stdout.split() == [str(mine / built.name)], result.stderr[-2000:]


# -- a full disk while writing the build record -----------------------------------------------------------------------
@pytest.fixture
def fake_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache_folder = tmp_path / "cache"
    monkeypatch.setenv("HPU_NB_CACHE_DIR", str(cache_folder))
    monkeypatch.setenv("CXX", str(FAKE_CXX))
    return cache_folder


def test_a_full_disk_while_writing_the_record_says_what_where_and_how_much_room_and_leaves_nothing(
        fake_build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = builtins.open

    class FullDisk:
        def __init__(self, handle: object) -> None:
            self.handle = handle

        def __enter__(self) -> FullDisk:
            return self

        def __exit__(self, *exc: object) -> None:
            self.handle.close()

        def write(self, data: str) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def opening(file: object, mode: str = "r", *args: object, **kwargs: object) -> object:
        handle = real_open(file, mode, *args, **kwargs)
        if "w" in mode and str(file).endswith(build.RECORD_SUFFIX):
            return FullDisk(handle)
        return handle

    monkeypatch.setattr(builtins, "open", opening)
    with pytest.raises(build.DeviceBuildError) as err:
        build.build(quiet=True)
    message = str(err.value)
    assert "Writing the emulated device's build record" in message and str(fake_build) in message
    assert "No space left on device" in message and "free space on that file system:" in message
    assert sorted(p.name for p in fake_build.iterdir()) == [".build.lock"]  # no .partial-*, no library without record


@pytest.mark.skipif(not AS_ROOT or not shutil.which("mount"), reason="mounting a small tmpfs needs root")
def test_a_full_tmpfs_while_writing_the_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], check=False).returncode:
        pytest.skip("this container may not mount a tmpfs")
    try:
        filling = tmp_path / "filling_cxx.sh"  # writes the library, then fills the disk, as a neighbour's job might
        filling.write_text(textwrap.dedent(f"""\
            #!/bin/sh
            {FAKE_CXX} "$@" || exit 1
            cat /dev/zero > {disk}/filler 2>/dev/null
            exit 0
        """))
        filling.chmod(0o755)
        monkeypatch.setenv("HPU_NB_CACHE_DIR", str(disk / "cache"))
        monkeypatch.setenv("CXX", str(filling))
        with pytest.raises(build.DeviceBuildError, match=r"(?s)build record .*No space left on device.*free space"):
            build.build(quiet=True)
        assert sorted(p.name for p in (disk / "cache").iterdir()) == [".build.lock"]
    finally:
        subprocess.run(["umount", str(disk)], check=False)

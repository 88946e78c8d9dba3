"""Who may write the folders hpu_nb runs code from: the cache of compiled modules and the emulated device's library.

hpu_nb's cache directory (HPU_NB_CACHE_DIR, else $XDG_CACHE_HOME/hpu_nb, else ~/.cache/hpu_nb) holds code that every
Python process of the environment runs: the standalone flavour's compiled modules and the device library torch's
autoload loads at `import torch`. Whoever can write that folder can run code as you, so, as careful tools do (ssh's
`StrictModes` checks each folder above a key file; pip refuses a cache it does not own; Python's own `__pycache__`
lives beside code only its owner can write), code is read from a folder only when

- the folder is owned by you and neither its group nor others may write it, and
- every folder above it (the path as written and the path its links lead to) is owned by you or root and is not
  writable by others, unless it is sticky (/tmp: others cannot rename or remove what is yours there).

A folder that fails is refused for code, with one message per process naming it and what to do; hpu_nb then uses a
private folder of the temp directory: one of yours found there (`hpu_nb-cache-<uid>-*`, owned by you, mode 0700:
nobody else can make such a folder), else a new one made by `mkdtemp` (a name nobody can take first). Folders hpu_nb
makes are private (0700). Data files (fp8 measurements) are not code and keep the plain cache directory.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from hpu_nb.runtime.env import CACHE_ENV, cache_dir

PRIVATE_MODE = 0o700
TEMP_PREFIX = "hpu_nb-cache-"  # + uid + "-" + mkdtemp's random part


def _who(uid: int) -> str:
    try:
        import pwd  # noqa: PLC0415 -- lazy: only for a message

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _chain(path: Path) -> list[Path]:
    """The folders above `path`, as written (absolute) and as its links resolve, without repeats."""
    seen: list[Path] = []
    for start in (Path(os.path.abspath(path)), Path(os.path.realpath(path))):
        for parent in start.parents:
            if parent not in seen:
                seen.append(parent)
    return seen


def folder_problem(path: str | os.PathLike[str]) -> str | None:
    """Why code in the folder `path` could be someone else's (a phrase: "is owned by ..."), None when only you (and
    root) can change what is in it."""
    uid = os.geteuid()
    folder = Path(path)
    try:
        info = os.stat(folder)
    except OSError as err:
        return f"cannot be read ({err.strerror or err})"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a folder"
    if info.st_uid != uid:
        return f"is owned by {_who(info.st_uid)}, not by you ({_who(uid)})"
    if info.st_mode & 0o022:
        return f"can be written by other users (mode {stat.S_IMODE(info.st_mode):o})"
    for parent in _chain(folder):
        try:
            above = os.stat(parent)
        except OSError as err:
            return f"lies in {parent}, which cannot be read ({err.strerror or err})"
        if above.st_uid not in (uid, 0):
            return f"lies in {parent}, owned by {_who(above.st_uid)}, who could replace it"
        if above.st_mode & 0o022 and not above.st_mode & stat.S_ISVTX:
            return (f"lies in {parent}, which other users can write (mode {stat.S_IMODE(above.st_mode):o}), so they"
                    " could replace it")
    return None


def file_problem(path: str | os.PathLike[str]) -> str | None:
    """Why the file `path` (in a folder that passed folder_problem) could be someone else's, None when it is yours."""
    try:
        info = os.lstat(path)
    except OSError as err:
        return f"cannot be read ({err.strerror or err})"
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if info.st_uid != os.geteuid():
        return f"is owned by {_who(info.st_uid)}"
    if info.st_mode & 0o022:
        return f"can be written by other users (mode {stat.S_IMODE(info.st_mode):o})"
    return None


_said: set[str] = set()


def say_refused(folder: Path, problem: str, instead: str) -> None:
    """The one message (per folder and process) saying why hpu_nb runs no code from `folder`, and what to do."""
    if str(folder) in _said:
        return
    _said.add(str(folder))
    print(f"hpu_nb: the cache folder {folder} {problem}: hpu_nb runs no code from it (compiled modules, the emulated"
          f" device's library). Make it yours alone (`chmod 700 {folder}`, holding only files you wrote), or set"
          f" {CACHE_ENV} to a private folder; a team that shares a prebuilt device library names it with"
          f" HPU_NB_SHARED_LIBRARY (README: \"Bad input, and what you get\"). {instead}", file=sys.stderr, flush=True)


def _temp_root() -> Path:
    return Path(tempfile.gettempdir())


def private_temp_dirs() -> list[Path]:
    """Your private folders of the temp directory (made by new_private_temp_dir), oldest name first."""
    prefix = f"{TEMP_PREFIX}{os.geteuid()}-"
    root = _temp_root()
    try:
        names = sorted(entry.name for entry in os.scandir(root) if entry.name.startswith(prefix))
    except OSError:
        return []
    return [root / name for name in names if folder_problem(root / name) is None]


def new_private_temp_dir() -> Path:
    """A new private folder of the temp directory, under a name nobody could take first (mkdtemp, mode 0700)."""
    return Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.geteuid()}-"))


def make_private_dir(folder: Path) -> str | None:
    """Create `folder` (mode 0700; its missing parents as mkdir makes them) unless it exists; then folder_problem().
    OSError when it cannot be created."""
    if not folder.is_dir():
        folder.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # made at this moment by another rank: checked below as any other
            folder.mkdir(mode=PRIVATE_MODE)
    return folder_problem(folder)


def trusted_cache_dir() -> Path | None:
    """cache_dir() when it exists and passes folder_problem (else None, with the message when it is refused)."""
    primary = cache_dir()
    if not primary.exists():
        return None
    problem = folder_problem(primary)
    if problem is None:
        return primary
    say_refused(primary, problem, "Using a private folder of the temp directory instead.")
    return None


def code_dirs() -> Iterator[Path]:
    """The folders that may hold code hpu_nb wrote before, in the order to look: cache_dir() when trusted, then your
    private temp folders (looked for only when asked for: `import torch` usually stops at the first)."""
    primary = trusted_cache_dir()
    if primary is not None:
        yield primary
    yield from private_temp_dirs()


class NoPrivateFolderError(OSError):
    """No folder hpu_nb may keep code in could be made: the message lists each tried and why."""


def writable_code_dir() -> tuple[Path, str | None]:
    """(the folder to write code into, a note when it is not cache_dir() saying why). cache_dir() is created private
    if missing; where it cannot be (a read-only HOME) or is refused, one of your private temp folders is used, a new
    one if none. NoPrivateFolderError when nothing can be made."""
    primary = cache_dir()
    try:
        problem = make_private_dir(primary)
    except OSError as err:
        why = f"the cache directory {primary} cannot be written ({err.strerror or err})"
        if os.environ.get(CACHE_ENV):  # named on purpose: not replaced by another folder in silence
            raise NoPrivateFolderError(f"{CACHE_ENV}: {why}") from err
    else:
        if problem is None and os.access(primary, os.W_OK | os.X_OK):
            return primary, None
        if problem is None:
            why = f"the cache directory {primary} cannot be written (no write permission)"
        else:
            say_refused(primary, problem, "Using a private folder of the temp directory instead.")
            why = f"the cache directory {primary} {problem}"
    for folder in private_temp_dirs():
        if os.access(folder, os.W_OK | os.X_OK):
            return folder, why
    try:
        return new_private_temp_dir(), why
    except OSError as err:
        raise NoPrivateFolderError(
            f"{why}; and no private folder could be made in {_temp_root()} ({err.strerror or err})") from err

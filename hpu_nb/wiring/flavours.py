"""hpu_nb.core for the standalone packages (`pytorch_lightning`, `lightning_fabric`), derived from the one source.

`lightning.pytorch` and `pytorch_lightning` ship the same code as two module trees with separate classes and
registries: Lightning writes `src/lightning/` once and builds the standalone packages from it by rewriting the imports
(`lightning.pytorch` -> `pytorch_lightning`, `lightning.fabric` -> `lightning_fabric`; `create_mirror_package` in its
`.actions/assistant.py`, run when a standalone wheel is built). hpu_nb applies the same rewrite, at import time:
`hpu_nb._standalone.core.<module>` is `hpu_nb/core/<module>.py` compiled with `lightning.pytorch` read as
`pytorch_lightning`, `lightning.fabric` as `lightning_fabric` and `hpu_nb.core` as `hpu_nb._standalone.core`.

Why at import time and not at build time, as Lightning does: Lightning ships one wheel per package, each holding one
tree; hpu_nb ships one wheel serving both flavours, so a build-time mirror would put a second, generated copy of every
HPU class in the wheel and in every source checkout (`pip install -e .`, `make test`), to be kept in step with the
first. Rewriting on import keeps one owner per class: the standalone flavour is only ever a mechanical reading of
hpu_nb/core (same lines, so tracebacks and `inspect.getsource` point at the real file), built only when a standalone
package is used. The cost is that the rewrite is textual: anything in hpu_nb/core that names Lightning in a form the
rules below miss would load the other flavour (`import lightning as L`, `from lightning import ...`, a module name
assembled from pieces). tests/core/test_flavours.py reads every translated module and fails on such a name, and checks
that the shared modules core imports (runtime, traces, emulator) load no Lightning of either flavour. Besides
hpu_nb/core, the notebook layer's Lightning Callback (MemoryMonitor) is translated the same way (TRANSLATED_MODULES).
Compiled translations are cached in hpu_nb's cache directory, as Python caches bytecode, so the ranks of a job and
each new kernel do not translate and compile them again (benchmarks/bench_standalone_mirror.py).
"""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import importlib
import importlib.util
import marshal
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import CodeType
from typing import Any

PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # hpu_nb/
STANDALONE = "hpu_nb._standalone"
TRANSLATED = "hpu_nb.core"  # the tree that imports Lightning; everything else (runtime, traces) is shared
# Lightning-derived modules outside that tree, translated the same way: the notebook layer's Lightning Callback.
TRANSLATED_MODULES = ("hpu_nb.notebook.memory_monitor",)
BYTECODE_DIR = "standalone-bytecode"  # under hpu_nb's cache directory (HPU_NB_CACHE_DIR, ~/.cache/hpu_nb)

_RULES = (  # (pattern, replacement, flags); compiled on first translation, not on `import torch`
    (r"\blightning\.pytorch\b", "pytorch_lightning", 0),
    (r"\blightning\.fabric\b", "lightning_fabric", 0),
    (r"\bhpu_nb\.core\b", f"{STANDALONE}.core", 0),
    *((rf"\b{re.escape(name)}\b", STANDALONE + name[len("hpu_nb"):], 0) for name in TRANSLATED_MODULES),
    # the same names written as regular expressions (a warnings filter's `module=`): `lightning\.pytorch\.x`
    (r"\blightning\\\.pytorch\b", "pytorch_lightning", 0),
    (r"\blightning\\\.fabric\b", "lightning_fabric", 0),
    (r"^(\s*)import lightning$", r"\1import pytorch_lightning as lightning", re.MULTILINE),
)


def translate(source: str) -> str:
    """The standalone-package reading of a module written against `lightning` (same lines, other names)."""
    for pattern, replacement, flags in _RULES:
        source = re.sub(pattern, replacement, source, flags=flags)
    return source


def is_translated(module_name: str) -> bool:
    """Whether hpu_nb's module `module_name` (untranslated name) has a standalone translation."""
    return (module_name == TRANSLATED or module_name.startswith(f"{TRANSLATED}.")
            or module_name in TRANSLATED_MODULES)


def _source_path(relative: str) -> tuple[Path, bool] | None:
    """(file, is_package) of hpu_nb's module `relative` ("core.strategies.single"), found without importing it."""
    base = PACKAGE_ROOT.joinpath(*relative.split("."))
    if (base / "__init__.py").is_file():
        return base / "__init__.py", True
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py"), False
    return None


def translated_code(path: Path, fullname: str) -> CodeType:
    """The compiled translation of `path`, from hpu_nb's cache when this source and these rules were translated
    before (each rank of a job, each new kernel, would otherwise translate and compile every module again).

    The cache file's name holds a digest of the source and the rules, and its content starts with a format mark and
    the interpreter's bytecode magic number, so a changed source, rule or Python never reads a stale translation.
    Nothing is written with PYTHONDONTWRITEBYTECODE or where no private cache folder can be written (the module is
    compiled as before).

    The bytes are code this process runs, so they are read only from a folder no other user can write
    (hpu_nb.runtime.cache), and only when their keyed digest (BLAKE2b with a key of yours kept in that folder,
    recorded at write) is right: a damaged file (a bit flip once made marshal crash the interpreter) or one written
    by anyone without the key is compiled again, never given to `marshal.loads`.
    """
    source = path.read_bytes()
    digest = hashlib.blake2b(source + repr(_RULES).encode(), digest_size=12).hexdigest()
    name = f"{fullname}.{digest}.{sys.implementation.cache_tag}.bin"
    magic = FORMAT + importlib.util.MAGIC_NUMBER
    for folder, key in _bytecode_stores():
        with contextlib.suppress(OSError, ValueError, EOFError, TypeError):
            data = (folder / name).read_bytes()
            head = len(magic) + TAG_SIZE
            if data.startswith(magic) and hmac.compare_digest(data[len(magic):head], _tag(key, name, data[head:])):
                code = marshal.loads(data[head:])
                if isinstance(code, CodeType):
                    return code
    code = compile(translate(source.decode("utf-8")), str(path), "exec", dont_inherit=True)
    if not sys.dont_write_bytecode:
        with contextlib.suppress(OSError):
            folder, key = _writable_bytecode_store()
            payload = marshal.dumps(code)
            _write_cache(folder / name, magic + _tag(key, name, payload) + payload,
                         stale=f"{fullname}.*.{sys.implementation.cache_tag}.bin")
    return code


# Each file: FORMAT, the interpreter's magic number, the keyed digest (TAG_SIZE bytes), the marshalled code. FORMAT
# comes first so that an hpu_nb from before the digest (which read "magic number + marshal") never takes these as its.
FORMAT = b"hpu_nb keyed 1\n"
TAG_SIZE = 32  # bytes of the keyed BLAKE2b digest after the magic number
KEY_NAME = ".key"  # the per-user key, in the bytecode folder (mode 0600)


def _tag(key: bytes, name: str, payload: bytes) -> bytes:
    """The keyed digest of a cache file's bytes and name (a valid file of another module moved here fails too)."""
    return hashlib.blake2b(name.encode() + b"\0" + payload, key=key, digest_size=TAG_SIZE).digest()


_stores: dict[str, list[tuple[Path, bytes]]] = {}  # cache_dir() -> its readable stores; looked up once a process


def _bytecode_stores() -> list[tuple[Path, bytes]]:
    """(folder, key) of each bytecode folder that may be read: in a trusted cache folder, private, with a key."""
    from hpu_nb.runtime import cache  # noqa: PLC0415 -- lazy: only when a standalone module is loaded
    from hpu_nb.runtime.env import cache_dir  # noqa: PLC0415 -- lazy, as above

    known = str(cache_dir())
    if known not in _stores:
        stores = []
        for base in cache.code_dirs():
            folder = base / BYTECODE_DIR
            key = _read_key(folder) if folder.is_dir() and cache.folder_problem(folder) is None else None
            if key is not None:
                stores.append((folder, key))
        _stores[known] = stores
    return _stores[known]


def _writable_bytecode_store() -> tuple[Path, bytes]:
    """(folder, key) to write into, made private (and the key made) if needed; OSError when none can be."""
    from hpu_nb.runtime import cache  # noqa: PLC0415 -- lazy: only when a standalone module is loaded
    from hpu_nb.runtime.env import cache_dir  # noqa: PLC0415 -- lazy, as above

    base, _ = cache.writable_code_dir()
    folder = base / BYTECODE_DIR
    problem = cache.make_private_dir(folder)
    if problem is not None:
        cache.say_refused(folder, problem, "Compiled modules are not cached.")
        raise PermissionError(f"{folder} {problem}")
    key = _read_key(folder) or _make_key(folder)
    store = (folder, key)
    stores = _stores.setdefault(str(cache_dir()), [])
    if store not in stores:
        stores.insert(0, store)
    return store


def _read_key(folder: Path) -> bytes | None:
    from hpu_nb.runtime.cache import file_problem  # noqa: PLC0415 -- lazy, as above

    key_file = folder / KEY_NAME
    if file_problem(key_file) is not None:
        return None
    with contextlib.suppress(OSError):
        key = key_file.read_bytes()
        if len(key) == TAG_SIZE:
            return key
    return None


def _make_key(folder: Path) -> bytes:
    """A new random key, put in place atomically (os.link fails if a rank made one first: that one is used)."""
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=f"{KEY_NAME}.")  # mode 0600
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(os.urandom(TAG_SIZE))
        with contextlib.suppress(FileExistsError):
            os.link(temporary, folder / KEY_NAME)
    finally:
        os.unlink(temporary)
    key = _read_key(folder)
    if key is None:
        raise PermissionError(f"the key {folder / KEY_NAME} of hpu_nb's compiled modules is not yours or not whole")
    return key


def _write_cache(target: Path, data: bytes, stale: str) -> None:
    """Write atomically (ranks write the same file at once), then remove this module's older translations."""
    with contextlib.suppress(OSError):
        for old in target.parent.glob(stale):
            if old != target:
                old.unlink(missing_ok=True)
        handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(data)
            os.replace(temporary, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)


class _TranslatingLoader:  # a Loader, duck-typed: importlib.abc costs ms on the autoload path
    def __init__(self, path: Path) -> None:
        self.path = path

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        exec(translated_code(self.path, module.__name__), module.__dict__)

    def get_source(self, fullname: str) -> str:
        return translate(self.path.read_text(encoding="utf-8"))


class _StandaloneFinder:  # a MetaPathFinder, duck-typed
    """Finds `hpu_nb._standalone` (and its folders) and the translated modules under it."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if fullname != STANDALONE and not fullname.startswith(f"{STANDALONE}."):
            return None
        original = "hpu_nb" + fullname[len(STANDALONE):]
        if fullname == STANDALONE or any(name.startswith(f"{original}.") for name in TRANSLATED_MODULES):
            return importlib.util.spec_from_loader(fullname, loader=_NamespaceLoader(), is_package=True)
        found = _source_path(original.partition(".")[2]) if is_translated(original) else None
        if found is None:
            return None
        file, is_package = found
        spec = importlib.util.spec_from_file_location(
            fullname, file, loader=_TranslatingLoader(file),
            submodule_search_locations=[str(file.parent)] if is_package else None,
        )
        return spec


class _NamespaceLoader:  # a Loader, duck-typed
    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        module.__path__ = []
        module.__doc__ = "hpu_nb's Lightning-derived modules translated for the standalone pytorch_lightning /" \
                         " lightning_fabric packages."


_FINDER = _StandaloneFinder()


def install() -> None:
    """Make `hpu_nb._standalone.*` importable (cheap, idempotent)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def flavour_module(flavour: str, name: str) -> Any:
    """hpu_nb's module `hpu_nb.<name>` ("core.accelerator", "notebook.memory_monitor") for flavour "lightning", or
    its translation for "standalone"."""
    install()
    return importlib.import_module(f"hpu_nb.{name}" if flavour == "lightning" else f"{STANDALONE}.{name}")


def core_module(flavour: str, name: str) -> Any:
    """`hpu_nb.core.<name>` (or hpu_nb.core for "") for flavour "lightning", or its translation for "standalone"."""
    return flavour_module(flavour, f"core.{name}" if name else "core")


# The Fabric pieces, by name: hpu_nb.core.fabric's __all__ and what hpu_nb.lightning_fabric serves (which must not
# import core to list them: that would load Lightning).
FABRIC_NAMES = ("HPUAccelerator", "HPUCheckpointIO", "HPUDDPStrategy", "HPUFSDPPrecision", "HPUFSDPStrategy",
                "HPUParallelStrategy", "HPUPrecision", "SingleHPUStrategy")

# The distribution whose release a flavour runs on (pyproject.toml pins the range of each).
DISTRIBUTIONS = {"lightning": "lightning", "standalone": "pytorch-lightning"}


# -- a piece of one flavour given to the other package's Trainer / Fabric ----------------------------------------------
# (flavour, "Trainer" | "Fabric") -> (the package a user builds it from, hpu_nb's module of its pieces)
_PACKAGES = {
    ("lightning", "Trainer"): ("lightning.pytorch", "hpu_nb"),
    ("lightning", "Fabric"): ("lightning.fabric", "hpu_nb.fabric"),
    ("standalone", "Trainer"): ("pytorch_lightning", "hpu_nb.pytorch_lightning"),
    ("standalone", "Fabric"): ("lightning_fabric", "hpu_nb.lightning_fabric"),
}


class LightningFlavourError(TypeError):
    """An hpu_nb piece built for `lightning` was given to `pytorch_lightning` / `lightning_fabric`, or the reverse."""


def flavour_of_module(module_name: str) -> str | None:
    """"lightning" for the modules that have a translation, "standalone" for their translation, None for any other."""
    if module_name.startswith(f"{STANDALONE}."):
        return "standalone"
    if is_translated(module_name):
        return "lightning"
    return None


def other_flavour_message(piece: Any, flavour: str, owner: str) -> str | None:
    """What to say when `piece` (a strategy, accelerator or plugin given to the `flavour` package's `owner`, "Trainer"
    or "Fabric") is an hpu_nb piece of the other flavour: Lightning would only say "invalid type" or "invalid name".
    None for anything else."""
    if isinstance(piece, (str, int, type(None))):
        return None
    hpu_class = next((cls for cls in type(piece).__mro__ if flavour_of_module(cls.__module__) is not None), None)
    if hpu_class is None:
        return None
    theirs = flavour_of_module(hpu_class.__module__)
    if theirs == flavour:
        return None
    ours_package, ours_module = _PACKAGES[(flavour, owner)]
    theirs_package = _PACKAGES[(str(theirs), owner)][0]
    name = hpu_class.__name__
    subclass = type(piece) is not hpu_class
    what = f"hpu_nb's {name} for `{theirs_package}`"
    what = f"{type(piece).__name__} (derived from {what})" if subclass else what
    message = (f"{what} was given to a `{ours_package}` {owner}: the two packages have separate classes, so that"
               f" {owner} cannot use it.")
    if name in getattr(importlib.import_module(ours_module), "__all__", ()):
        message += (f" With `{ours_package}`, {'derive from' if subclass else 'use'} `from {ours_module} import"
                    f" {name}`; or build the {owner} from `{theirs_package}`.")
    else:
        message += f" hpu_nb's pieces for a `{ours_package}` {owner} are in `{ours_module}`."
    return message

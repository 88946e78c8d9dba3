"""The standalone flavour is hpu_nb.core rewritten (hpu_nb/wiring/flavours.py): a tripwire for what the rewrite misses.

Every module under hpu_nb/core is translated here as the import hook translates it, and read: no import, module name
or logger / warnings-filter pattern may still name the `lightning` package or the untranslated `hpu_nb.core`, and the
shared modules core imports (runtime, traces, emulator) must load no Lightning of either flavour. A name the rules miss
would load the other flavour's classes under a `pytorch_lightning` Trainer, silently.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpu_nb.wiring import flavours

CORE = flavours.PACKAGE_ROOT / "core"
LIGHTNING_TOPS = ("lightning", "pytorch_lightning", "lightning_fabric")
# a Lightning or hpu_nb.core module name in a string: dotted (`lightning.pytorch.x`) or as a regex (`lightning\.x`)
_NAME_IN_TEXT = re.compile(r"(?<![\w.\\])(lightning(\\?\.)[A-Za-z_]|hpu_nb\\?\.core\b)")


def _module_name(path: Path, root: str) -> tuple[str, bool]:
    parts = list(path.relative_to(flavours.PACKAGE_ROOT).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return ".".join([root, *(parts[:-1] if is_package else parts)]), is_package


def _imports(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[int, str, str | None]]:
    """(line, absolute module, imported name or None) of every import, module level or not."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                yield node.lineno, base, alias.name


def _docstrings(tree: ast.AST) -> set[int]:
    scopes = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    nodes: list[Any] = [tree, *(n for n in ast.walk(tree) if isinstance(n, scopes))]
    firsts = [n.body[0] for n in nodes if n.body]
    return {id(f.value) for f in firsts if isinstance(f, ast.Expr) and isinstance(f.value, ast.Constant)
            and isinstance(f.value.value, str)}


def misses(source: str, module: str, is_package: bool = False) -> list[str]:
    """What in a translated module still names the `lightning` package or the untranslated hpu_nb.core."""
    tree = ast.parse(source)
    found = []
    for line, imported, name in _imports(tree, module, is_package):
        if imported == "lightning" or imported.startswith(("lightning.", "hpu_nb.core")):
            found.append(f"{line}: import of {imported}" + (f" ({name})" if name else ""))
        elif imported == "hpu_nb" and name in ("core", "fabric"):
            found.append(f"{line}: import of hpu_nb.{name}")
    docstrings = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings and (
                node.value == "lightning" or _NAME_IN_TEXT.search(node.value)):
            found.append(f"{node.lineno}: string {node.value[:60]!r}")
    return found


def _core_modules() -> list[Path]:
    """Every translated module's file: hpu_nb/core and the Lightning-derived modules outside it."""
    others = [flavours._source_path(name.partition(".")[2]) for name in flavours.TRANSLATED_MODULES]
    return sorted(CORE.rglob("*.py")) + [found[0] for found in others if found is not None]


@pytest.mark.parametrize("path", _core_modules(), ids=lambda p: str(p.relative_to(flavours.PACKAGE_ROOT)))
def test_the_translated_module_names_no_lightning_and_no_untranslated_core(path):
    module, is_package = _module_name(path, "hpu_nb._standalone")
    found = misses(flavours.translate(path.read_text(encoding="utf-8")), module, is_package)
    assert not found, (f"{path}: after the rewrite (hpu_nb/wiring/flavours.py) these still name the `lightning` package"
                       f" or hpu_nb.core, so the standalone flavour would load the other one: {found}. Write the name"
                       " as "
                       "`lightning.pytorch...` / `lightning.fabric...` / `hpu_nb.core...`, or teach flavours a rule.")


def test_the_check_catches_what_the_rules_miss():
    written = textwrap.dedent('''
        """A docstring may say lightning.pytorch freely."""
        import lightning as L
        from lightning import Trainer
        from hpu_nb import core
        from lightning.pytorch import Callback
        NAME = "lightning"
        LOGGER = "lightning.pytorch.utilities.rank_zero"
        PATTERN = r"lightning\\.pytorch\\.utilities"
        OTHER = r"lightning\\.fabric\\.x"
        CORE = "hpu_nb.core.selection"
        fine = "pytorch_lightning.callbacks and lightning_fabric.x, and Lightning's docs"
    ''')
    found = misses(flavours.translate(written), "hpu_nb._standalone.core.example")
    assert [f.split(":")[0] for f in found] == ["3", "4", "5", "7"], found  # rewritten: 6, 8, 9, 10, 11
    untranslated = misses(written, "hpu_nb.core.example")
    assert len(untranslated) == 9, untranslated


def _shared_modules_reached_from_core() -> dict[str, Path]:
    """hpu_nb modules outside core that the translated core imports, and everything they import in turn."""
    pending, seen = [], {}
    for path in _core_modules():
        module, is_package = _module_name(path, "hpu_nb._standalone")
        tree = ast.parse(flavours.translate(path.read_text(encoding="utf-8")))
        pending += [(imported, name) for _, imported, name in _imports(tree, module, is_package)]
    while pending:
        imported, name = pending.pop()
        if not imported.startswith("hpu_nb") or imported.startswith("hpu_nb._standalone"):
            continue
        for candidate in ([f"{imported}.{name}"] if name else []) + [imported]:
            found = flavours._source_path(candidate.partition(".")[2]) if candidate != "hpu_nb" else \
                (flavours.PACKAGE_ROOT / "__init__.py", True)
            if found is None:
                continue
            if candidate not in seen:
                seen[candidate] = found[0]
                tree = ast.parse(found[0].read_text(encoding="utf-8"))
                pending += [(i, n) for _, i, n in _imports(tree, candidate, found[1])]
            break
    return seen


def test_the_shared_modules_the_translation_imports_load_no_lightning():
    """runtime, traces, emulator are shared by both flavours: one that imported Lightning (or hpu_nb.core, or the
    package root, which serves `lightning`'s classes) would bring one flavour into the other."""
    shared = _shared_modules_reached_from_core()
    assert "hpu_nb.runtime" in shared  # the walk followed the imports
    assert "hpu_nb" not in shared, "the translated core imports the hpu_nb package root (it serves `lightning`'s names)"
    wrong = []
    for module, path in shared.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for line, imported, _ in _imports(tree, module, path.name == "__init__.py"):
            if imported.split(".")[0] in LIGHTNING_TOPS or imported.startswith("hpu_nb.core"):
                wrong.append(f"{module}:{line} imports {imported}")
    assert not wrong, wrong


def test_a_fresh_python_on_the_standalone_packages_never_loads_lightning_or_hpu_nb_core():
    code = textwrap.dedent("""
        import sys, warnings
        warnings.simplefilter("ignore")
        import lightning_fabric
        import pytorch_lightning as pl
        import hpu_nb.lightning_fabric as fabric_pieces
        import hpu_nb.pytorch_lightning as trainer_pieces
        for pieces in (trainer_pieces, fabric_pieces):
            for name in pieces.__all__:
                getattr(pieces, name)
        pl.Trainer(accelerator="hpu", devices=1, logger=False, enable_progress_bar=False)
        lightning_fabric.Fabric(accelerator="hpu", devices=1)
        print(sorted(m for m in sys.modules if m == "lightning" or m.startswith(("lightning.", "hpu_nb.core"))))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPU_NB_", "PT_HPU"))}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                            check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_translations_are_compiled_once_and_read_back_from_the_cache(tmp_path, monkeypatch):
    """A second translation of the same source reads the cached code; a changed source gets a new entry and the old
    one goes; a damaged entry is compiled again; nothing is written under PYTHONDONTWRITEBYTECODE."""
    monkeypatch.setenv("HPU_NB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    source = tmp_path / "example.py"
    source.write_text("from lightning.pytorch import Callback\nNAME = 'lightning.pytorch.callbacks'\n")
    first = flavours.translated_code(source, "hpu_nb._standalone.core.example")
    cached = sorted((tmp_path / "cache" / flavours.BYTECODE_DIR).glob("*.bin"))
    assert len(cached) == 1 and cached[0].name.startswith("hpu_nb._standalone.core.example.")
    assert "pytorch_lightning.callbacks" in first.co_consts

    compiled = []
    monkeypatch.setattr(flavours, "translate", lambda text: compiled.append(text) or text)
    again = flavours.translated_code(source, "hpu_nb._standalone.core.example")
    assert compiled == [] and again.co_consts == first.co_consts and again.co_filename == str(source)

    source.write_text("NAME = 'lightning.fabric'\n")
    flavours.translated_code(source, "hpu_nb._standalone.core.example")
    assert len(compiled) == 1
    after_change = sorted((tmp_path / "cache" / flavours.BYTECODE_DIR).glob("*.bin"))
    assert len(after_change) == 1 and after_change != cached

    after_change[0].write_bytes(after_change[0].read_bytes()[:20])  # a truncated entry
    flavours.translated_code(source, "hpu_nb._standalone.core.example")
    assert len(compiled) == 2

    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setenv("HPU_NB_CACHE_DIR", str(tmp_path / "other"))
    flavours.translated_code(source, "hpu_nb._standalone.core.example")
    assert not (tmp_path / "other").exists()


def test_a_fresh_python_loads_the_standalone_flavour_from_the_cache_without_translating(tmp_path):
    """What each rank of a job and each new kernel does: the first process fills the cache, the next translates
    nothing (its translate() would fail) and still builds a pytorch_lightning Trainer with the MemoryMonitor twin."""
    code = textwrap.dedent("""
        import sys, warnings
        warnings.simplefilter("ignore")
        from hpu_nb.wiring import flavours
        if sys.argv[1] == "cached":
            def refuse(text):
                raise AssertionError("translated again")
            flavours.translate = refuse
        import pytorch_lightning as pl
        import hpu_nb.pytorch_lightning as trainer_pieces
        for name in trainer_pieces.__all__:
            getattr(trainer_pieces, name)
        trainer = pl.Trainer(accelerator="hpu", devices=1, logger=False, enable_progress_bar=False,
                             callbacks=[trainer_pieces.MemoryMonitor()])
        print(type(trainer.strategy).__module__, isinstance(trainer_pieces.MemoryMonitor(), pl.Callback))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPU_NB_", "PT_HPU"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["HPU_NB_CACHE_DIR"] = str(tmp_path)
    for mode in ("first", "cached"):
        result = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, timeout=300,
                                env=env, check=False)
        assert result.returncode == 0, (mode, result.stderr[-3000:])
        assert result.stdout.split()[-2:] == ["hpu_nb._standalone.core.strategies.single", "True"], result.stdout
    names = {p.name.split(".")[2] for p in (tmp_path / flavours.BYTECODE_DIR).glob("*.bin")}
    assert {"core", "notebook"} <= names

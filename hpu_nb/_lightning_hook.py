"""Run hpu_nb's Lightning registration once `lightning.pytorch` is imported, without importing it ourselves.

`import hpu_nb` must stay cheap, yet `Trainer(accelerator="hpu")` must work whichever package the user imported
first. If Lightning is already loaded we register now; otherwise a one-shot import hook registers right after
`lightning.pytorch` finishes loading.
"""

from __future__ import annotations

import importlib.machinery
import sys
from typing import Any

TARGET = "lightning.pytorch"


def _register() -> None:
    from hpu_nb.core.registration import register_all

    register_all()


class _AfterLightningImport:
    """A meta path finder (duck-typed, to keep importlib.abc out of the import time)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        original_exec = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            original_exec(module)
            remove()
            _register()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_finder = _AfterLightningImport()


def remove() -> None:
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


def install() -> None:
    """Register now if Lightning is loaded, else when it is."""
    module = sys.modules.get(TARGET)
    if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False) is False:
        _register()
        return
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)

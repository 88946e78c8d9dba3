"""Run a callback right after a module has been imported, without importing it ourselves.

`import hpu_nb` and torch's autoload must stay cheap, yet hpu_nb has to act once Lightning (or torch._dynamo) is
loaded, whichever is imported first. One duck-typed meta path finder (importlib.abc would cost milliseconds on
`import torch`) wraps the target's loader; it removes itself when nothing is pending.
"""

from __future__ import annotations

import importlib.machinery
import sys
from collections.abc import Callable
from typing import Any


def is_initializing(name: str) -> bool:
    """Whether module `name` is being executed right now (imported, not yet finished)."""
    module = sys.modules.get(name)
    return module is not None and bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


class _AfterImport:  # a MetaPathFinder, duck-typed
    def __init__(self) -> None:
        self.pending: dict[str, Callable[[], None]] = {}

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        callback = self.pending.get(fullname)
        if callback is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        original_exec = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            original_exec(module)
            self.pending.pop(fullname, None)
            if not self.pending and self in sys.meta_path:
                sys.meta_path.remove(self)
            callback()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_finder = _AfterImport()


def after_import(name: str, callback: Callable[[], None]) -> None:
    """Call `callback()` once module `name` has been executed (the next time it is imported)."""
    _finder.pending[name] = callback
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def pending() -> dict[str, Callable[[], None]]:
    return dict(_finder.pending)

"""Run hpu_nb's Lightning registration once Lightning is imported, without importing it ourselves.

`import hpu_nb` must stay cheap, yet `Trainer(accelerator="hpu")` and `Fabric(accelerator="hpu")` must work whichever
package the user imported first, and for both Lightning distributions: `lightning` (`lightning.pytorch` and
`lightning.fabric`) and the standalone `pytorch_lightning` / `lightning_fabric`, which have registries of their own.
If a target is already loaded we register now; otherwise a one-shot import hook registers right after it loads.
"""

from __future__ import annotations

import importlib.machinery
import sys
from typing import Any, Callable

# module -> flavour of hpu_nb.core to register with it ("lightning": hpu_nb.core; "standalone": its translation)
TARGETS = {
    "lightning.pytorch": "lightning",
    "pytorch_lightning": "standalone",
    "lightning_fabric": "standalone",
}


# The last module each package's __init__ imports: when torch's autoload brings hpu_nb in while the package is still
# executing (`import pytorch_lightning` imports torch first), registration waits for this one.
# tests/test_pytorch_lightning.py fails if a Lightning release moves it.
LAST_IMPORT = {name: f"{name}._graveyard" for name in TARGETS}


def _register(trigger: str) -> None:
    if trigger == "lightning_fabric" and _is_initializing("pytorch_lightning"):
        return  # pytorch_lightning is importing lightning_fabric: registration follows once pytorch_lightning is loaded
    from hpu_nb import _flavours

    _flavours.core_module(TARGETS[trigger], "registration").register_all()


def _is_initializing(name: str) -> bool:
    module = sys.modules.get(name)
    return module is not None and bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


class _AfterImport:
    """A meta path finder (duck-typed, to keep importlib.abc out of the import time) that runs a callback after a
    target module has executed."""

    def __init__(self, targets: dict[str, Callable[[], None]]) -> None:
        self.pending = dict(targets)

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
            if not self.pending:
                remove()
            callback()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_finder = _AfterImport({})


def remove() -> None:
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


def install() -> None:
    """Register with each Lightning package that is loaded, and hook the ones that are not (yet)."""
    for name in TARGETS:
        callback = (lambda name=name: _register(name))
        module = sys.modules.get(name)
        if module is None:
            _finder.pending[name] = callback
        elif _is_initializing(name):
            _finder.pending[LAST_IMPORT[name]] = callback
        else:
            callback()
    if _finder.pending and _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)

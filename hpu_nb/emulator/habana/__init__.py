"""The emulated `habana_frameworks` surface: what Gaudi users' code imports, backed by the emulated hpu device.

`install()` adds a finder at the end of `sys.meta_path`, so `import habana_frameworks.torch.core as htcore` finds
this package only when no real `habana_frameworks` is installed: it never shadows Habana's software. The same finder
answers torch's own `import torch.hpu` (what torch does before the first `device="hpu"` tensor), so plain torch code
works after `import hpu_nb`. The modules model the parts of Habana's API that user code and Lightning integrations
call (as github.com/HabanaAI/gaudi-pytorch-bridge has them); each says that it is emulated.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Asked by the finder so as never to shadow Habana's package.
from hpu_nb.runtime.habana_install import HABANA_PACKAGE, is_emulated, real_habana_spec

PACKAGE = HABANA_PACKAGE
ROOT = Path(__file__).with_name(PACKAGE)
HPU_MODULE = "habana_frameworks.torch.hpu"
# The package Habana's transformer engine is a shim over (1.19+); fp8 checks (accelerate) look for it by name.
TE_PACKAGE = "intel_transformer_engine"
TE_ROOT = Path(__file__).with_name(TE_PACKAGE)
# Habana's media data loader, imported by name in Model-References' scripts (`import habana_dataloader`).
DATALOADER_PACKAGE = "habana_dataloader"
DATALOADER_ROOT = Path(__file__).with_name(DATALOADER_PACKAGE)


class _TorchHpuLoader:  # a Loader, duck-typed (importlib.abc would cost ms on torch's autoload path)
    """`torch.hpu` is the emulated habana_frameworks.torch.hpu module, as on a Gaudi it is Habana's."""

    def create_module(self, spec: Any) -> Any:
        return importlib.import_module(HPU_MODULE)

    def exec_module(self, module: Any) -> None:
        pass


def emulated_spec(name: str = PACKAGE) -> Any:
    """The module spec of an emulated top-level package, `habana_frameworks`, `intel_transformer_engine` or
    `habana_dataloader` (their submodules come from their __path__)."""
    root = {PACKAGE: ROOT, TE_PACKAGE: TE_ROOT, DATALOADER_PACKAGE: DATALOADER_ROOT}[name]
    return importlib.util.spec_from_file_location(name, root / "__init__.py", submodule_search_locations=[str(root)])


class _EmulatedHabanaFinder:  # a MetaPathFinder, duck-typed
    """Finds the emulated top-level `habana_frameworks` package (its submodules come from its __path__)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if fullname == PACKAGE:
            return emulated_spec()
        if fullname in (TE_PACKAGE, DATALOADER_PACKAGE) and real_habana_spec() is None:
            return emulated_spec(fullname)
        if fullname == "torch.hpu" and real_habana_spec() is None:
            return importlib.machinery.ModuleSpec(fullname, _TorchHpuLoader())
        return None


_FINDER = _EmulatedHabanaFinder()


class HabanaConflictError(RuntimeError):
    """Habana's own `habana_frameworks` (or the test fake) is imported in this process: the emulation cannot be."""


def load_surface() -> tuple[Any, Any]:
    """(htcore, hthpu) of the emulated surface, imported even where Habana's package is installed but not yet imported.

    Refuses when a non-emulated `habana_frameworks` is already imported: it owns `torch.hpu` and the hpu device.
    """
    loaded = sys.modules.get(PACKAGE)
    if loaded is not None and not is_emulated(loaded):
        raise HabanaConflictError(
            f"Habana's software ({getattr(loaded, '__file__', PACKAGE)}) is already imported in this process and owns"
            " the `hpu` device, so the emulated Gaudi cannot run here. Start a new Python with PT_HPU_AUTOLOAD=0 and"
            " HPU_NB_BACKEND=emulated, before anything imports habana_frameworks."
        )
    if loaded is None:
        spec = _FINDER.find_spec(PACKAGE, None)
        module = importlib.util.module_from_spec(spec)
        sys.modules[PACKAGE] = module
        spec.loader.exec_module(module)
    return importlib.import_module("habana_frameworks.torch.core"), importlib.import_module(HPU_MODULE)


def install() -> None:
    """Let `import habana_frameworks` / `import torch.hpu` fall back to the emulated surface (idempotent, cheap)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)


class _TorchHpuPlaceholder(types.ModuleType):
    """`torch.hpu` from `import torch` on, as on a Gaudi, whose autoload imports Habana's hpu module: Gaudi code calls
    `torch.hpu.is_available()` or `torch.load(..., map_location="hpu")` with nothing else imported. The emulated
    module is imported at the first attribute asked for (importing it loads the device's kernels, tens of ms that
    most `import torch` never need) and then replaces this placeholder as `torch.hpu`."""

    def __getattr__(self, name: str) -> Any:
        return getattr(importlib.import_module(HPU_MODULE), name)


def install_torch_hpu() -> None:
    """Give an imported torch its `torch.hpu` where Habana's software is absent (torch's autoload calls this)."""
    torch = sys.modules.get("torch")
    if torch is not None and "hpu" not in vars(torch) and real_habana_spec() is None:
        torch.hpu = _TorchHpuPlaceholder("torch.hpu", "The emulated Gaudi's torch.hpu (loaded on first use).")

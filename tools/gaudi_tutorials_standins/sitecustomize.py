"""Stand-ins for what Habana's Gaudi-tutorials notebooks download, loaded at interpreter start (the kernel's and every
process a notebook starts: `!python train.py`, torchrun) by tools/run_gaudi_tutorials.py through PYTHONPATH.

Nothing here is Habana's: it stands in for the network (datasets, hub models, a downloaded checkpoint) and for one
environment gap (PyPI's torchvision is a CUDA build whose C++ ops cannot load beside a CPU torch). Each stand-in is
applied when its module is first imported, so a process that never imports torchvision / transformers / datasets
pays nothing.

It also measures, for the runner's report, into GAUDI_TUTORIALS_PROBE_DIR (tutorial_standins.probe_*): whether the
process used the `hpu` device (the emulated card's allocation counter at exit) and, for Lightning fits, the loss of
every training step with the device it was computed on.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from typing import Any

_PATCHES: dict[str, str] = {  # module imported -> function of tutorial_standins run right after it
    "torchvision.datasets": "patch_torchvision_datasets",
    "transformers": "patch_transformers",
    "datasets": "patch_datasets",
    # a callback that records each training step's loss (the Trainer's own module: hpu_nb's import hook is the one
    # that sees the packages themselves)
    "pytorch_lightning.trainer.trainer": "patch_lightning",
    "lightning.pytorch.trainer.trainer": "patch_lightning",
}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a patch once its module has been executed."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in _PATCHES:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader, patch = spec.loader, _PATCHES[name]

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec: Any) -> Any:
                return loader.create_module(spec)

            def exec_module(self, module: Any) -> None:
                loader.exec_module(module)
                import tutorial_standins

                getattr(tutorial_standins, patch)(module)

        spec.loader = _Loader()
        return spec


if os.environ.get("GAUDI_TUTORIALS_STANDINS") == "1":
    # torchvision's C++ ops (nms, roi_align, ...) are absent here: skip the fake-tensor registrations that need them.
    import types

    sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
    sys.meta_path.insert(0, _AfterImport())
    import builtins

    builtins.input = lambda prompt="": (print(prompt + "Once upon a time") or "Once upon a time")  # type: ignore[assignment]
    if os.environ.get("GAUDI_TUTORIALS_PROBE_DIR"):
        import atexit

        def _write_device_probe() -> None:
            import tutorial_standins

            tutorial_standins.probe_write_device_use()

        atexit.register(_write_device_probe)

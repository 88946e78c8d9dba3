"""The device seam: one DeviceBackend interface, two implementations (real Gaudi, emulated Gaudi).

`get_backend()` picks one once per process: HPU_NB_BACKEND=auto (default) uses a Gaudi when
habana_frameworks finds one and the emulated Gaudi otherwise; `gaudi` / `emulated` force it.
This package is the only place that imports habana_frameworks.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hpu_nb.runtime.env import lazy_mode_from_env
from hpu_nb.runtime.habana_install import real_habana_spec

if TYPE_CHECKING:
    from hpu_nb.runtime.base import DeviceBackend

__all__ = [
    "MEMORY_STAT_KEYS",
    "DeviceBackend",
    "DeviceFacts",
    "GENERATIONS",
    "Generation",
    "HPUNotAvailableError",
    "Versions",
    "cache_dir",
    "get_backend",
    "is_out_of_memory",
    "reset_backend",
    "set_backend",
]

# Loaded on first use: torch's autoload imports hpu_nb.runtime.generations (and so this package) on every
# `import torch`, which must stay cheap; so are the backends below (logging, subprocess, torch, the device).
_LAZY = {
    "MEMORY_STAT_KEYS": "hpu_nb.runtime.base",
    "DeviceBackend": "hpu_nb.runtime.base",
    "DeviceFacts": "hpu_nb.runtime.base",
    "HPUNotAvailableError": "hpu_nb.runtime.base",
    "Versions": "hpu_nb.runtime.base",
    "is_out_of_memory": "hpu_nb.runtime.base",
    "GENERATIONS": "hpu_nb.runtime.generations",
    "Generation": "hpu_nb.runtime.generations",
    "cache_dir": "hpu_nb.runtime.env",  # hpu_nb's cache directory (HPU_NB_CACHE_DIR, ~/.cache/hpu_nb)
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


BACKEND_CHOICES = ("auto", "gaudi", "emulated")

_backend: DeviceBackend | None = None
_lock = threading.Lock()


_emulated_backend: Callable[[], DeviceBackend] | None = None


def register_emulated_backend(factory: Callable[[], DeviceBackend]) -> None:
    """Where the emulated Gaudi plugs in (hpu_nb/emulator/__init__.py does, when imported): the runtime holds the
    contract and picks a backend, but never imports the emulator."""
    global _emulated_backend
    _emulated_backend = factory


def _create_backend() -> DeviceBackend:
    """The one place that picks a backend."""
    choice = os.environ.get("HPU_NB_BACKEND", "auto").strip().lower() or "auto"
    if choice not in BACKEND_CHOICES:
        raise ValueError(f"HPU_NB_BACKEND={choice!r} is not valid; choose one of: {', '.join(BACKEND_CHOICES)}.")
    if choice != "emulated":
        # Lazy, as every import below: the package is imported by torch's autoload, which must stay cheap.
        from hpu_nb.runtime.base import HPUNotAvailableError  # noqa: PLC0415
        from hpu_nb.runtime.gaudi import GaudiBackend, probe_gaudi  # noqa: PLC0415

        if real_habana_spec() is not None:  # before Habana's import, whose HCCL module does int(PT_HPU_LAZY_MODE)
            lazy_mode_from_env(default=False)  # only checks the value: the mode is Habana's to decide
        found, reason = probe_gaudi()
        if found:
            return GaudiBackend()
        if choice == "gaudi":
            raise HPUNotAvailableError(
                f"HPU_NB_BACKEND=gaudi but no Gaudi can be used here: {reason}. "
                "Unset HPU_NB_BACKEND (or set it to 'emulated') to use the emulated Gaudi on the CPU."
            )
        if real_habana_spec() is not None:
            raise HPUNotAvailableError(
                f"Habana's software is installed but no Gaudi can be used here: {reason}. The emulated Gaudi cannot"
                " run beside Habana's software in one process: fix the Gaudi (check `hl-smi`), or start a new Python"
                " with PT_HPU_AUTOLOAD=0 and HPU_NB_BACKEND=emulated to train on the emulated Gaudi."
            )
    if _emulated_backend is None:  # `import hpu_nb` imports the emulator package, which registers it
        raise RuntimeError("hpu_nb's emulated Gaudi did not register its backend: hpu_nb/emulator/__init__.py was not"
                           " imported (a broken installation? reinstall hpu_nb)")
    return _emulated_backend()


def get_backend() -> DeviceBackend:
    """The process-wide device backend (created on first call, never at import)."""
    global _backend
    if _backend is None:
        with _lock:
            if _backend is None:
                _backend = _create_backend()
    return _backend


def set_backend(backend: DeviceBackend | None) -> None:
    """Install a backend explicitly (tests, or a fresh emulated card in a forked worker)."""
    global _backend
    with _lock:
        _backend = backend


def reset_backend() -> None:
    """Forget the chosen backend so the next get_backend() reads the environment again."""
    set_backend(None)

"""A fake Intel Gaudi for tests: the `habana_frameworks` package (built to /work/shared/habana_api.md),
an optional fake `pyhlml`, and a fake `hl-smi` executable (see hlsmi.py).

The fake package lives on disk (site_packages/) so that module names, `__module__` of its functions and
`importlib.util.find_spec` behave like the real install; `install_fake_habana()` puts it on sys.path,
sets HPU_NB_BACKEND=gaudi, resets hpu_nb's backend, and undoes all of it (including what importing the
fake changed in torch) on exit. Every call into the fake is recorded in `FakeHabana.calls`.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from pathlib import Path
from typing import Any, Iterator

HERE = Path(__file__).resolve().parent
SITE = str(HERE / "site_packages")
PYHLML_SITE = str(HERE / "site_pyhlml")
# Environment the fake (or code under test through it) may set; restored on uninstall.
_ENV_KEYS = ("HPU_NB_BACKEND", "WORLD_SIZE", "RANK", "LOCAL_RANK", "ID", "HLS_MODULE_ID")
_MISSING = object()
CONFIG_ENV = "HPU_NB_FAKE_HABANA_CONFIG"  # read by habana_frameworks/_fake.py in a child process

__all__ = ["FakeHabana", "install_fake_habana", "block_habana", "SITE", "PYHLML_SITE"]


class FakeHabana:
    """Handle on the installed fake: its configuration, call log and per-card memory."""

    def __init__(self, state: Any) -> None:
        self.state = state

    @property
    def config(self) -> Any:
        return self.state.config

    @property
    def calls(self) -> Any:
        return self.state.calls

    def memory(self, index: int) -> Any:
        """What the machine's tools (pyhlml, hl-smi) report for another card `index` (allocate()/free() move it).

        The card this process drives is the emulated hpu device: its memory moves with real hpu tensors.
        """
        if index == self.config.current_device:
            raise ValueError(f"card {index} is this process's card: allocate hpu tensors to move its counters")
        return self.state.card(index)

    def allocate(self, nbytes: int, index: int) -> None:
        self.memory(index).allocate(nbytes)

    def free(self, nbytes: int, index: int) -> None:
        self.memory(index).free(nbytes)

    def set_metric(self, name: str, **tags: Any) -> None:
        self.state.metrics[name].update(tags)

    def subprocess_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for a child Python process that should see this same fake Gaudi (spawned workers)."""
        import dataclasses
        import json

        env = dict(os.environ if base is None else base)
        env["PYTHONPATH"] = os.pathsep.join([SITE, *filter(None, [env.get("PYTHONPATH")])])
        env[CONFIG_ENV] = json.dumps(dataclasses.asdict(self.config))
        return env

    @property
    def pyhlml(self) -> Any:
        """The fake pyhlml module (to set DELAY_S / FAIL_INIT), when installed with pyhlml=True."""
        return importlib.import_module("pyhlml")

    def __repr__(self) -> str:
        return f"<FakeHabana {self.config} {self.calls!r}>"


@contextlib.contextmanager
def install_fake_habana(config: Any = None, *, pyhlml: bool = False, backend: str | None = "gaudi",
                        **overrides: Any) -> Iterator[FakeHabana]:
    """Install the fake Gaudi (FakeConfig fields as keyword overrides, e.g. device_count=2, device_name="GAUDI3").

    backend: value for HPU_NB_BACKEND while installed (None leaves it unset, to test auto-selection).
    pyhlml: also make the fake `pyhlml` importable; otherwise `import pyhlml` fails while installed.
    """
    from hpu_nb.runtime.emulated_habana import is_emulated_module

    loaded = sys.modules.get("habana_frameworks")
    if loaded is not None and not (str(getattr(loaded, "__file__", "")).startswith(SITE) or is_emulated_module(loaded)):
        raise RuntimeError("The real habana_frameworks is already imported; the fake cannot replace it.")
    from hpu_nb.runtime import reset_backend

    saved_env = {key: os.environ.get(key) for key in _ENV_KEYS}
    saved_pyhlml = sys.modules.get("pyhlml", _MISSING)
    saved_emulated = _emulated_state()
    _drop_modules()
    paths = [SITE] + ([PYHLML_SITE] if pyhlml else [])
    for path in reversed(paths):
        sys.path.insert(0, path)
    if not pyhlml:
        sys.modules["pyhlml"] = None  # type: ignore[assignment]  (import pyhlml -> ImportError)
    importlib.invalidate_caches()
    if backend is None:
        os.environ.pop("HPU_NB_BACKEND", None)
    else:
        os.environ["HPU_NB_BACKEND"] = backend
    reset_backend()
    try:
        fake = importlib.import_module("habana_frameworks._fake")
        cfg = config if config is not None else fake.FakeConfig()
        for key, value in overrides.items():
            if not hasattr(cfg, key):
                raise TypeError(f"FakeConfig has no field {key!r}")
            setattr(cfg, key, value)
        fake.STATE.reset(cfg)
        yield FakeHabana(fake.STATE)
    finally:
        reset_backend()
        state = getattr(sys.modules.get("habana_frameworks._fake"), "STATE", None)
        if state is not None:
            _undo_torch_changes(state.originals)
            state.originals.clear()
        _drop_modules()
        for path in paths:
            while path in sys.path:
                sys.path.remove(path)
        if saved_pyhlml is _MISSING:
            sys.modules.pop("pyhlml", None)
        else:
            sys.modules["pyhlml"] = saved_pyhlml  # type: ignore[assignment]
        importlib.invalidate_caches()
        _restore_emulated_state(saved_emulated)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def block_habana() -> Iterator[None]:
    """A machine without Gaudi software: no `habana_frameworks` on sys.path (the emulated surface still answers)."""
    from hpu_nb.runtime.emulated_habana import real_habana_spec

    if real_habana_spec() is not None:
        raise RuntimeError("habana_frameworks is installed on sys.path: uninstall the fake first")
    saved = sys.modules.get("pyhlml", _MISSING)
    sys.modules["pyhlml"] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if saved is _MISSING:
            sys.modules.pop("pyhlml", None)
        else:
            sys.modules["pyhlml"] = saved  # type: ignore[assignment]


def _emulated_state() -> tuple[dict[str, Any], Any]:
    """The emulated Gaudi's modules and `torch.hpu` as they are before the fake is installed."""
    import torch

    modules = {n: m for n, m in sys.modules.items() if n == "habana_frameworks" or n.startswith("habana_frameworks.")}
    if "torch.hpu" in sys.modules:
        modules["torch.hpu"] = sys.modules["torch.hpu"]
    return modules, getattr(torch, "hpu", None)


def _restore_emulated_state(saved: tuple[dict[str, Any], Any]) -> None:
    """Put back what the emulated Gaudi had: code that imported habana_frameworks / torch.hpu before the fake was
    installed keeps working after it is removed."""
    import torch

    modules, torch_hpu = saved
    sys.modules.update(modules)
    if torch_hpu is not None and getattr(torch, "hpu", None) is None:
        torch._register_device_module("hpu", torch_hpu)


def _drop_modules() -> None:
    for name in [n for n in sys.modules if n == "habana_frameworks" or n.startswith("habana_frameworks.")]:
        del sys.modules[name]
    module = sys.modules.get("pyhlml")
    if module is not None and str(getattr(module, "__file__", "")).startswith(PYHLML_SITE):
        del sys.modules["pyhlml"]


def _undo_torch_changes(originals: dict[str, Any]) -> None:
    """Put back what importing the fake changed in torch: ProfilerActivity, torch.hpu, the "hccl" backend, and the
    card's Limit / name (the emulated device becomes the environment's emulated Gaudi again)."""
    import torch

    from hpu_nb.runtime import hpu_device

    if hpu_device.is_loaded():
        hpu_device.configure(hpu_device.config_from_environment())
    if "ProfilerActivity" in originals:
        torch.profiler.ProfilerActivity = originals["ProfilerActivity"]
    if originals.get("torch.hpu registered"):
        if hasattr(torch, "hpu"):
            delattr(torch, "hpu")
        sys.modules.pop("torch.hpu", None)
    if originals.get("hccl registered"):
        import torch.distributed as dist

        backend = dist.Backend
        if "hccl" in backend.backend_list:
            backend.backend_list.remove("hccl")
        if hasattr(backend, "HCCL"):
            delattr(backend, "HCCL")
        for device, name in list(backend.default_device_backend_map.items()):
            if name == "hccl":
                del backend.default_device_backend_map[device]
        backend.backend_type_map.pop("hccl", None)
        backend.backend_capability.pop("hccl", None)
        backend._plugins.pop("HCCL", None)

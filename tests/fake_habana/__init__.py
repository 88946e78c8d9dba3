"""A fake Intel Gaudi for tests: the `habana_frameworks` package (built to Habana's published bridge source), Intel's
transformer engine it re-exports, an optional fake `pyhlml`, and a fake `hl-smi` executable (see hlsmi.py).

The fake package lives on disk (site_packages/) so that module names, `__module__` of its functions and
`importlib.util.find_spec` behave like the real install. `install_fake_habana()` makes a machine directory (shared with
child processes: which process holds which card, and the `habana-torch-plugin` distribution of the chosen release),
puts the fake on sys.path, sets HPU_NB_BACKEND=gaudi, resets hpu_nb's backend, and undoes all of it on exit,
including what importing the fake changed in torch (torch.hpu, the profiler classes, "hccl", "hpu_backend") and in
the environment (Habana's import sets MASTER_ADDR / MASTER_PORT / HABANA_PROFILE...). Every call into the fake is
recorded in `FakeHabana.calls`; every card acquisition in `FakeHabana.acquisitions()`.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SITE = str(HERE / "site_packages")
PYHLML_SITE = str(HERE / "site_pyhlml")
# Environment the fake (or code under test through it) may set; restored on uninstall.
_ENV_KEYS = ("HPU_NB_BACKEND", "WORLD_SIZE", "RANK", "LOCAL_RANK", "ID", "HLS_MODULE_ID", "MASTER_ADDR", "MASTER_PORT",
             "HABANA_PROFILE", "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST", "PT_HPU_AUTOCAST_FP32_OPS_LIST",
             "LOWER_LIST", "FP32_LIST")
_MISSING = object()
CONFIG_ENV = "HPU_NB_FAKE_HABANA_CONFIG"  # read by habana_frameworks/_fake.py in a child process
_FAKE_PACKAGES = ("habana_frameworks", "intel_transformer_engine", "habana_dataloader")

__all__ = ["FakeHabana", "install_fake_habana", "block_habana", "SITE", "PYHLML_SITE"]


class FakeHabana:
    """Handle on the installed fake: its configuration, call log, card acquisitions and other cards' memory."""

    def __init__(self, state: Any) -> None:
        self.state = state

    @property
    def config(self) -> Any:
        return self.state.config

    @property
    def calls(self) -> Any:
        return self.state.calls

    @property
    def machine_dir(self) -> Path:
        return Path(self.config.machine_dir)

    def acquisitions(self) -> list[dict[str, Any]]:
        """Every card acquired on the fake machine by any process of this test: {"pid", "ppid", "card", "how"}."""
        return self.state.machine.acquisitions()

    def memory(self, index: int) -> Any:
        """What the machine's tools (pyhlml, hl-smi) report for card `index` (allocate()/free() move it).

        The card this process drives is the emulated hpu device: its memory moves with real hpu tensors.
        """
        return self.state.card(index)

    def allocate(self, nbytes: int, index: int) -> None:
        self.memory(index).allocate(nbytes)

    def free(self, nbytes: int, index: int) -> None:
        self.memory(index).free(nbytes)

    def set_metric(self, name: str, **tags: Any) -> None:
        self.state.metrics[name].update(tags)

    def subprocess_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for a child Python process that sees this same fake Gaudi (same machine, same release)."""
        import dataclasses
        import json

        env = dict(os.environ if base is None else base)
        env["PYTHONPATH"] = os.pathsep.join([SITE, _dist_site(self.config), *filter(None, [env.get("PYTHONPATH")])])
        env[CONFIG_ENV] = json.dumps(dataclasses.asdict(self.config))
        return env

    @property
    def pyhlml(self) -> Any:
        """The fake pyhlml module (to set DELAY_S / FAIL_INIT), when installed with pyhlml=True."""
        return importlib.import_module("pyhlml")

    def __repr__(self) -> str:
        return f"<FakeHabana {self.config} {self.calls!r}>"


def _dist_site(config: Any) -> str:
    return str(Path(config.machine_dir) / "site")


def _write_distribution(config: Any) -> None:
    """The `habana-torch-plugin` distribution of the chosen release (where Habana's version is read from)."""
    site = Path(_dist_site(config))
    shutil.rmtree(site, ignore_errors=True)
    info = site / f"habana_torch_plugin-{config.release}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: habana-torch-plugin\nVersion: {config.release}\n")
    # Since 1.18 `import torch` loads Habana's software through this entry point (in eager mode).
    (info / "entry_points.txt").write_text("[torch.backends]\ndevice_backend = habana_frameworks.autoload:__autoload\n")


def _is_fake_or_emulated(module: Any) -> bool:
    from hpu_nb.emulator.habana import DATALOADER_ROOT, ROOT, TE_ROOT

    paths = [str(p) for p in (getattr(module, "__path__", None) or [getattr(module, "__file__", "") or ""])]
    return all(p.startswith((SITE, str(ROOT), str(TE_ROOT), str(DATALOADER_ROOT))) for p in paths)


@contextlib.contextmanager
def install_fake_habana(config: Any = None, *, pyhlml: bool = False, backend: str | None = "gaudi",
                        **overrides: Any) -> Iterator[FakeHabana]:
    """Install the fake Gaudi (FakeConfig fields as keyword overrides, e.g. device_count=2, release="1.18.0").

    backend: value for HPU_NB_BACKEND while installed (None leaves it unset, to test auto-selection).
    pyhlml: also make the fake `pyhlml` importable; otherwise `import pyhlml` fails while installed.
    """
    loaded = sys.modules.get("habana_frameworks")
    if loaded is not None and not _is_fake_or_emulated(loaded):
        raise RuntimeError("The real habana_frameworks is already imported; the fake cannot replace it.")
    from hpu_nb.runtime import reset_backend

    saved_env = {key: os.environ.get(key) for key in _ENV_KEYS}
    saved_pyhlml = sys.modules.get("pyhlml", _MISSING)
    saved_modules = _take_modules()  # the emulated surface, if loaded: put back as it was afterwards
    machine = tempfile.mkdtemp(prefix="fake-gaudi-")
    paths = [SITE, str(Path(machine) / "site")] + ([PYHLML_SITE] if pyhlml else [])
    for path in reversed(paths):
        sys.path.insert(0, path)
    try:
        importlib.invalidate_caches()
        _as_on_a_gaudi_process_start()
        fake = importlib.import_module("habana_frameworks._fake")
        fake_config = config if config is not None else fake.FakeConfig()
        for key, value in overrides.items():
            if not hasattr(fake_config, key):
                raise TypeError(f"FakeConfig has no field {key!r}")
            setattr(fake_config, key, value)
        fake_config.machine_dir = machine
        _write_distribution(fake_config)
        if not pyhlml:
            sys.modules["pyhlml"] = None  # type: ignore[assignment]  (import pyhlml -> ImportError)
        importlib.invalidate_caches()
        if backend is None:
            os.environ.pop("HPU_NB_BACKEND", None)
        else:
            os.environ["HPU_NB_BACKEND"] = backend
        reset_backend()
        fake.STATE.reset(fake_config)
        from torch.utils.checkpoint import DefaultDeviceType

        fake.STATE.originals["checkpoint device"] = DefaultDeviceType.get_device_type()  # Habana's _lazy_init sets it
        yield FakeHabana(fake.STATE)
    finally:
        reset_backend()
        state = getattr(sys.modules.get("habana_frameworks._fake"), "STATE", None)
        if state is not None:
            _undo_torch_changes(state.originals)
            state.originals.clear()
        _take_modules()
        sys.modules.update(saved_modules)
        for path in paths:
            while path in sys.path:
                sys.path.remove(path)
        if saved_pyhlml is _MISSING:
            sys.modules.pop("pyhlml", None)
        else:
            sys.modules["pyhlml"] = saved_pyhlml  # type: ignore[assignment]
        importlib.invalidate_caches()
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(machine, ignore_errors=True)


def _as_on_a_gaudi_process_start() -> None:
    """torch's "hpu_backend" as a process on a Gaudi starts: not the emulated backend (registered by an earlier test of
    this process; on a Gaudi hpu_nb hands torch Habana's), only hpu_nb's entry point for torch to find."""
    registry = sys.modules.get("torch._dynamo.backends.registry")
    if registry is None:
        return
    from hpu_nb.runtime.compile_backend import make_way_for_habana

    make_way_for_habana()
    if "hpu_backend" not in registry._COMPILER_FNS and registry._BACKENDS.get("hpu_backend") is None:
        from importlib.metadata import entry_points

        for found in entry_points(group="torch_dynamo_backends"):
            if found.name == "hpu_backend":
                registry._BACKENDS["hpu_backend"] = found


@contextlib.contextmanager
def block_habana() -> Iterator[None]:
    """A machine without Gaudi software: no `habana_frameworks` on sys.path (the emulated surface still answers)."""
    from hpu_nb.runtime.habana_install import real_habana_spec

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


def _take_modules() -> dict[str, Any]:
    """Remove (and return) every habana_frameworks / intel_transformer_engine module, and the fake pyhlml."""
    import inspect

    taken = {}
    for name in list(sys.modules):
        if any(name == p or name.startswith(p + ".") for p in _FAKE_PACKAGES):
            taken[name] = sys.modules.pop(name)
            # inspect.getmodule (which torch calls when it registers a custom op's fake kernel) caches each module
            # name's __file__; a namespace package under a name that had a file (the fake's habana_frameworks after
            # the emulated one) then fails `getfile` with "is a built-in module". Only a process that swaps the two
            # packages, as these tests do, meets it.
            inspect._filesbymodname.pop(name, None)  # type: ignore[attr-defined]
    module = sys.modules.get("pyhlml")
    if module is not None and str(getattr(module, "__file__", "")).startswith(PYHLML_SITE):
        del sys.modules["pyhlml"]
    return {name: module for name, module in taken.items() if not str(getattr(module, "__file__", "")).startswith(SITE)}


def _undo_torch_changes(originals: dict[str, Any]) -> None:
    """Put back what importing the fake changed in torch: the profiler classes, torch.hpu, "hccl", "hpu_backend", and
    the device's Limit, name and autocast lists (the emulated device becomes the environment's emulated Gaudi again)."""
    import warnings

    import torch
    import torch.autograd.profiler

    from hpu_nb.emulator import hpu_device

    if hpu_device.is_loaded():
        hpu_device.configure(hpu_device.config_from_environment())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from hpu_nb.emulator.hpu_device import autocast

            autocast.register(autocast.lists_from_environment())
    for name, target in (("ProfilerActivity", torch.profiler), ("profile", torch.profiler),
                         ("autograd.profile", torch.autograd.profiler)):
        if name in originals:
            setattr(target, name.rsplit(".", 1)[-1], originals[name])
    if "torch.hpu" in originals:
        if hasattr(torch, "hpu"):
            delattr(torch, "hpu")
        sys.modules.pop("torch.hpu", None)
        if originals["torch.hpu"] is not None:  # the emulated Gaudi's module, as it was before
            torch._register_device_module("hpu", originals["torch.hpu"])
    if "hpu_backend" in originals:
        from torch._dynamo.backends.registry import _BACKENDS, _COMPILER_FNS

        compiler, entry = originals["hpu_backend"]
        _COMPILER_FNS.pop("hpu_backend", None)
        _BACKENDS.pop("hpu_backend", None)
        if compiler is not None:
            _COMPILER_FNS["hpu_backend"] = compiler
            _BACKENDS["hpu_backend"] = entry
        else:  # torch may have discovered the entry points meanwhile (it does so once): hpu_nb's must stay found
            from importlib.metadata import entry_points

            for found in entry_points(group="torch_dynamo_backends"):
                if found.name == "hpu_backend":
                    _BACKENDS["hpu_backend"] = found
    if "dynamo skip dir" in originals:
        from torch._dynamo import trace_rules

        while originals["dynamo skip dir"] in trace_rules.SKIP_DIRS:
            trace_rules.SKIP_DIRS.remove(originals["dynamo skip dir"])
        trace_rules._recompile_re()
    if "checkpoint device" in originals:
        from torch.utils.checkpoint import DefaultDeviceType

        DefaultDeviceType.set_device_type(originals["checkpoint device"])
    if originals.get("hccl registered before") is False:
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
        from hpu_nb.emulator import hpu_device

        if hpu_device.is_loaded():  # the emulated Gaudi came into use meanwhile: its "hccl" stays, as it registers it
            from hpu_nb.emulator.hpu_device import hccl

            hccl.register()

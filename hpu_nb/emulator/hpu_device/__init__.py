"""The emulated Gaudi's `hpu` device: `torch.device("hpu")` made usable on the CPU.

`load()` builds (once, cached) and loads `hpu_device.cpp`, which gives torch's built-in `hpu` device type a device
guard, a counting allocator, kernels (every op runs its CPU kernel on the same host memory) and autocast with
Habana's op lists. Tensors on it are real `hpu` tensors: `x.device.type == "hpu"`, autograd, optimizers,
`torch.save` / `torch.load(map_location="hpu")` and `torch.autocast("hpu")` work as on a Gaudi, and the card's
memory counters are exact to the byte. One card per process (`hpu:0`), as on a Gaudi; a forked process gets a fresh,
empty card.

The `torch.hpu` module itself is the emulated `habana_frameworks.torch.hpu` (hpu_nb.emulator.habana), as on a
Gaudi, where `torch.hpu` is Habana's module.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

# build (where the library is) and hccl (what torch's autoload registers) only: torch's autoload imports this package on
# every `import torch`; the device's other parts load when it is first used (benchmarks/bench_autoload.py).
from hpu_nb.emulator.hpu_device import build, hccl
from hpu_nb.runtime.base import MEMORY_STAT_KEYS  # the device's counters come back in this order
from hpu_nb.runtime.env import lazy_mode_from_env, parse_size
from hpu_nb.runtime.generations import EMULATED_RELEASE, GENERATIONS, Generation

# torch's autoload (hpu_nb.wiring.torch_autoload) loads the device's library during `import torch`. When that import is
# this module's own (torch first imported at its top: a test suite's conftest, `python -m hpu_nb.emulator.hpu_device`),
# the autoload finds this module half made and leaves its work in `when_imported` instead, run at the end of this
# module. Declared without a value, so this line keeps what the autoload set.
when_imported: Callable[[], None] | None

__all__ = [
    "CardConfig",
    "DeviceConflictError",
    "MAX_DEVICE_COUNT",
    "card_config",
    "config_from_environment",
    "configure",
    "fresh_card",
    "is_loaded",
    "load",
    "memory_stats",
    "reset_peak_memory_stats",
]

DEFAULT_GENERATION = "gaudi2"
DEFAULT_DEVICE_COUNT = 8  # an HLS box: what hl-smi would list
MAX_DEVICE_COUNT = 64  # emulated cards on one machine; a Gaudi server has 8


class DeviceConflictError(RuntimeError):
    """Another `hpu` device (Habana's own software) is loaded in this process: the emulated one cannot be."""


class DeviceLoadedTooLateError(RuntimeError):
    """torch settled its HPU support before the emulated device was loaded, so autograd cannot run on it here."""


@dataclass(frozen=True)
class CardConfig:
    """What the emulated Gaudi is: its generation, each card's memory Limit, and how many cards the machine has."""

    generation: Generation
    memory_limit: int
    device_count: int = DEFAULT_DEVICE_COUNT
    device_count_is_explicit: bool = False  # HPU_NB_DEVICE_COUNT was set (devices="auto" uses 1 card otherwise)

    @property
    def label(self) -> str:
        return f"emulated {self.generation.device_name}"


def config_from_environment(
    generation: str | None = None,
    memory_limit: int | str | None = None,
    device_count: int | str | None = None,
) -> CardConfig:
    """The card described by the arguments, else by HPU_NB_DEVICE / HPU_NB_MEMORY_LIMIT / HPU_NB_DEVICE_COUNT."""
    key = (generation or os.environ.get("HPU_NB_DEVICE") or DEFAULT_GENERATION).strip().lower()
    if key not in GENERATIONS:
        raise ValueError(
            f"HPU_NB_DEVICE={key!r} is not an emulated generation; choose one of: {', '.join(GENERATIONS)}."
        )
    gen = GENERATIONS[key]
    limit_text = memory_limit if memory_limit is not None else os.environ.get("HPU_NB_MEMORY_LIMIT")
    if limit_text is None:
        limit = gen.hbm_bytes
    else:
        try:
            limit = limit_text if isinstance(limit_text, int) else parse_size(limit_text)
        except ValueError as err:
            raise ValueError(f"HPU_NB_MEMORY_LIMIT: {err}") from None
        if limit <= 0 or limit > gen.hbm_bytes:
            raise ValueError(
                f"HPU_NB_MEMORY_LIMIT={limit_text!r} ({limit} bytes) is not between 1 byte and the {gen.device_name}'s"
                f" {gen.hbm_bytes >> 30} GiB of HBM: a card cannot hold more than it has."
            )
    count_text = device_count if device_count is not None else os.environ.get("HPU_NB_DEVICE_COUNT")
    try:
        count = int(count_text) if count_text is not None else DEFAULT_DEVICE_COUNT
    except ValueError:
        raise ValueError(f"HPU_NB_DEVICE_COUNT must be a whole number, got {count_text!r}.") from None
    if not 1 <= count <= MAX_DEVICE_COUNT:
        raise ValueError(
            f"HPU_NB_DEVICE_COUNT={count_text!r}: the emulated machine has between 1 and {MAX_DEVICE_COUNT} cards"
            " (a Gaudi server has 8)."
        )
    return CardConfig(gen, limit, count, device_count_is_explicit=count_text is not None)


_lock = threading.RLock()
_library: str | None = None  # the loaded device library
_active = False  # the emulated Gaudi is in use in this process
_config: CardConfig | None = None


def is_loaded() -> bool:
    return _active


def load_library_if_built() -> bool:
    """Load the device library when it is already built (cheap: what `import torch` does through the autoload)."""
    global _library
    with _lock:
        if _library is None:
            if _hpu_device_taken():
                return False
            path = build.library_path()
            problem = build.library_problem(path) if path.exists() else "is not built yet"
            shared = build.shared_library() if problem is not None else None  # a team's, when named and as published
            if shared is not None:
                path, problem = shared, None
            if problem is not None:  # one not as built would crash the process (SIGBUS, SIGSEGV): never loaded
                if path.exists() and not problem.startswith("lies in"):  # a refused folder was named already
                    print(f"hpu_nb: the emulated device's library {path} {problem}: not loaded; the first use of"
                          " `hpu` builds it again.", file=sys.stderr, flush=True)
                return False
            _library = _load_library(path)
        return True


def card_config() -> CardConfig:
    """The emulated card in force (loading the device with the environment's settings if needed)."""
    return _config if _config is not None else load()


def load(config: CardConfig | None = None) -> CardConfig:
    """Make `hpu` usable here (idempotent); with `config`, (re)configure the card. Returns the card in force."""
    global _library, _active
    with _lock:
        if not _active:
            if _library is None:
                if _hpu_device_taken():
                    raise DeviceConflictError(
                        "The `hpu` device is already provided in this process (by Habana's own software,"
                        " habana_frameworks), so the emulated Gaudi cannot run here. Unset HPU_NB_BACKEND=emulated to"
                        " use the Gaudi, or start Python with PT_HPU_AUTOLOAD=0 and without importing"
                        " habana_frameworks to use the emulation."
                    )
                _library = _load_library(build.build())
            _activate()
            _active = True
        if config is not None or _config is None:
            configure(config or config_from_environment())
        assert _config is not None
        return _config


def announce() -> bool:
    """Have torch know the `hpu` device from now (torch.accelerator is hpu), configuring and using nothing: what
    loading Habana's library does on a Gaudi (its HPU hooks always answer hasHPU). For the test fake of a Gaudi;
    the emulated Gaudi announces itself when first used (load). False when the library is not built."""
    if not load_library_if_built():
        return False
    from hpu_nb.emulator.hpu_device import (  # noqa: PLC0415 -- lazy: at first use (see top)
        accelerator,
        backward,
        missing_kernels,
    )

    with _lock:  # as load() does: two threads using the device first at once settle the accelerator once
        torch.ops.hpu_emu.activate()  # sets the hooks' answer and sizes autograd's threads (none), see hpu_device.cpp
        accelerator.claim()  # hpu is torch's accelerator, as on a Gaudi (a CUDA build without a GPU too)
        missing_kernels.register()  # what Habana's bridge has no HPU kernel for is refused on the fake Gaudi too
        backward.install()  # so any backward on hpu runs on its calling thread, whatever uses the device first
    return True


def configure(config: CardConfig) -> None:
    """Set the card's Limit and name (what a different emulated machine would have); counters are kept."""
    global _config
    with _lock:
        if not _active:
            load(config)
            return
        torch.ops.hpu_emu.configure(int(config.memory_limit), config.label)
        _config = config


def memory_stats() -> dict[str, int]:
    """The card's ten Gaudi memory counters, exact to the byte."""
    return dict(zip(MEMORY_STAT_KEYS, torch.ops.hpu_emu.memory_stats()))


def reset_peak_memory_stats() -> None:
    torch.ops.hpu_emu.reset_peak_memory_stats()


def fresh_card() -> None:
    """Start an empty card, as a forked process gets: counters at zero, earlier tensors no longer counted."""
    load()
    torch.ops.hpu_emu.fresh_card()


def _hpu_device_taken() -> bool:
    """Whether something else (Habana's software) already provides kernels for the `hpu` device."""
    return _library is None and torch._C._dispatch_has_kernel_for_dispatch_key("aten::empty.memory_format", "HPU")


def _load_library(path: object) -> str:
    try:
        torch.ops.load_library(str(path))
    except OSError as err:
        raise build.DeviceBuildError(
            f"The emulated hpu device's library {path} does not load ({err}). `python -m hpu_nb.emulator.hpu_device`"
            " checks it against its build record and builds it again."
        ) from err
    return str(path)


def _activate() -> None:
    """Everything the emulated Gaudi sets up when first used: its HPU hooks, autocast lists, Habana ops, HCCL."""
    from hpu_nb.emulator.hpu_device import (  # noqa: PLC0415 -- lazy: at first use (see top)
        accelerator,
        autocast,
        backward,
        habana_ops,
        missing_kernels,
    )

    if not torch.ops.hpu_emu.activate():
        raise DeviceLoadedTooLateError(
            "torch looked up its HPU support before hpu_nb could load the emulated `hpu` device in this process, so"
            " backward passes on `hpu` tensors would fail here. Import hpu_nb (or torch, with hpu_nb installed and"
            " TORCH_DEVICE_BACKEND_AUTOLOAD / HPU_NB_AUTOLOAD not set to 0) before other torch code runs, e.g. at the"
            " top of the notebook, then restart the kernel."
        )
    accelerator.claim()  # which accelerator torch serves now (hpu, or a usable GPU's): see accelerator.py
    # lazy mode takes CPU tensors given to hpu ops as graph inputs, as Habana's lazy bridge does (hpu_device.cpp)
    torch.ops.hpu_emu.set_lazy_host_inputs(lazy_mode_from_env(EMULATED_RELEASE.lazy_by_default))
    autocast.register(autocast.lists_from_environment())
    missing_kernels.register()  # after the device's kernels (activate), which it overrides for those ops
    habana_ops.register()
    hccl.register()
    backward.install()  # backward on the calling thread, as the CPU's: no device threads, forks keep autograd
    os.register_at_fork(after_in_child=torch.ops.hpu_emu.fresh_card)


_deferred = globals().pop("when_imported", None)  # torch's autoload ran during this module's `import torch` (the top)
if _deferred is not None:
    _deferred()
del _deferred

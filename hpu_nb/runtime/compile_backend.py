"""How torch.compile finds "hpu_backend": hpu_nb's entry point, handing over to Habana's backend where it is installed.

On a Gaudi, Habana's `habana_frameworks.torch.dynamo.compile_backend` registers "hpu_backend" when its core loads
(eager mode, the default since 1.21, and lazy mode). Where Habana's software is absent, the device backend's graph
compiler is the one (the emulated Gaudi's: hpu_nb.emulator.graph_compiler, which also keeps Habana's graph metrics and
dynamic-shape switch).

hpu_nb publishes `hpu_backend` under the `torch_dynamo_backends` entry point, which torch consults only when no
"hpu_backend" is registered, so plain `import torch` code finds it. Where Habana's software is installed, Habana's
backend is the one to use, and it is registered by importing Habana's core in eager *and* lazy mode (1.19's
`habana_frameworks/torch/core/__init__.py` imports `dynamo.compile_backend.backends`, whose `@register_backend`
registers it, in either mode). Its `register_backend` refuses a name taken ("duplicate name: hpu_backend"), so hpu_nb
must never leave its own function registered there: when torch loads the entry point on such a machine, the attribute
(resolved by this module's `__getattr__`) imports Habana's core and hands torch Habana's function to register, so
torch registers Habana's and a later `import habana_frameworks.torch.core` finds nothing in its way. `hpu_backend`
names whichever function torch should run here.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any, NoReturn

from hpu_nb.runtime.habana_install import is_emulated, real_habana_spec

BACKEND_NAME = "hpu_backend"
HABANA_CORE = "habana_frameworks.torch.core"
REGISTRY_MODULE = "torch._dynamo.backends.registry"


# -- registration with dynamo ---------------------------------------------------------------------------------------
def __getattr__(name: str) -> Any:
    """`hpu_backend`, the entry point's target: the emulated backend, or on a machine with Habana's software Habana's
    own (its core imported now, so that Habana registers it once, before torch registers what this returns)."""
    if name != BACKEND_NAME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if real_habana_spec() is None:
        from hpu_nb.runtime import get_backend  # noqa: PLC0415 -- lazy: the package imports this module

        return get_backend().graph_compiler()
    return habanas_for_torch()


def make_way_for_habana() -> None:
    """Unregister the emulated backend if it is registered, so Habana's software can register its own on import."""
    registry = sys.modules.get("torch._dynamo.backends.registry")
    if registry is not None and is_emulated(registry._COMPILER_FNS.get(BACKEND_NAME)):
        del registry._COMPILER_FNS[BACKEND_NAME]


def habanas_for_torch() -> Callable[..., Any]:
    """Habana's hpu_backend, for torch's registry to register under the entry point's name.

    Importing Habana's core registers it; torch's `lookup_backend`, which asked for this attribute, then registers what
    it gets under the same name and would refuse a duplicate: so when torch's lookup is the caller, Habana's entry is
    taken out for torch to put back. Any other caller gets Habana's function and leaves the registry as it is.
    """
    from torch._dynamo.backends.registry import _COMPILER_FNS  # noqa: PLC0415 -- lazy: seconds to import

    make_way_for_habana()
    importlib.import_module(HABANA_CORE)
    habana = _COMPILER_FNS.get(BACKEND_NAME)
    if habana is None or is_emulated(habana):
        return no_habana_backend
    if _called_by_torchs_lookup():
        del _COMPILER_FNS[BACKEND_NAME]
    return habana


def _called_by_torchs_lookup() -> bool:
    frame: FrameType | None = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return False
        if frame.f_code.co_name == "lookup_backend" and frame.f_globals.get("__name__") == REGISTRY_MODULE:
            return True
        frame = frame.f_back
    return False


def no_habana_backend(graph_module: Any, example_inputs: list[Any], **kwargs: Any) -> NoReturn:
    raise RuntimeError(
        "torch.compile(backend='hpu_backend') needs Habana's own backend, and importing habana_frameworks.torch.core"
        " registered none (Gaudi software 1.19 and newer register it in eager and lazy mode). Check the Gaudi software"
        " installation (habana-torch-plugin), or run without torch.compile."
    )

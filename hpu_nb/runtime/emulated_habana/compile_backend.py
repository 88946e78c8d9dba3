"""torch.compile's "hpu_backend" for the emulated Gaudi, so `torch.compile(model, backend="hpu_backend")` runs as is.

On a Gaudi, Habana's `habana_frameworks.torch.dynamo.compile_backend` registers "hpu_backend" when its core loads in
eager mode: TorchDynamo captures the graph, AOTAutograd splits forward and backward, and Habana's graph compiler
builds them for the card. The emulated Gaudi does the same capture and split (AOTAutograd, torch's "aot_eager") and
runs the graphs with the device's CPU kernels. Measured with torch 2.13 on this machine: "aot_eager" works on `hpu`
tensors; "inductor" does not (it has no code generator for the `hpu` device: KeyError 'hpu', and registering its CPU
code generator for `hpu` fails deeper in its scheduler), so the emulation does not make graphs faster, only runs the
same code. Memory stays exact: compiled graphs allocate their tensors through the device's counting allocator like
eager ops do.

hpu_nb publishes this function under the `torch_dynamo_backends` entry point, which torch consults only when no
"hpu_backend" is registered. Where Habana's software is installed, Habana's own backend is the one to use: this
function then loads Habana's software (which registers it in eager mode, in place of this one) and hands the graph
over, or refuses in lazy mode, where Habana registers none (torch.compile is not supported there).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

NAME = "hpu_backend"
HABANA_CORE = "habana_frameworks.torch.core"
COMPILED = {"graphs": 0, "milliseconds": 0}  # what hpu.metrics' graph_compilation reports on the emulated Gaudi


def hpu_backend(graph_module: Any, example_inputs: list[Any], **kwargs: Any) -> Any:
    """Compile a captured graph for the emulated Gaudi: AOTAutograd, graphs run eagerly on the hpu device."""
    import torch

    from hpu_nb.runtime.emulated_habana import real_habana_spec

    if real_habana_spec() is not None:
        return _habanas(graph_module, example_inputs, **kwargs)
    import time

    from hpu_nb.runtime import hpu_device

    hpu_device.load()
    started = time.perf_counter()
    compiled = torch._dynamo.lookup_backend("aot_eager")(graph_module, example_inputs)
    COMPILED["graphs"] += 1
    COMPILED["milliseconds"] += round((time.perf_counter() - started) * 1000)
    return compiled


def make_way_for_habana() -> None:
    """Unregister this function if torch registered it, so Habana's software can register its own on import."""
    registry = sys.modules.get("torch._dynamo.backends.registry")
    if registry is not None and registry._COMPILER_FNS.get(NAME) is hpu_backend:
        del registry._COMPILER_FNS[NAME]


def _habanas(graph_module: Any, example_inputs: list[Any], **kwargs: Any) -> Any:
    from torch._dynamo.backends.registry import _COMPILER_FNS

    make_way_for_habana()
    importlib.import_module(HABANA_CORE)
    habana = _COMPILER_FNS.get(NAME)
    if habana is None:
        _COMPILER_FNS[NAME] = hpu_backend
        raise RuntimeError(
            "torch.compile(backend='hpu_backend') needs Habana's own backend, which habana_frameworks registers in"
            " eager mode only; this process runs Habana's software in lazy mode. Start Python with PT_HPU_LAZY_MODE=0"
            " (the default since Gaudi software 1.21) to compile, or run without torch.compile in lazy mode."
        )
    return habana(graph_module, example_inputs, **kwargs)

"""Fake habana_frameworks.torch.dynamo.compile_backend: registers torch.compile's "hpu_backend" (eager and lazy mode).

As the bridge's (1.19 compile_backend/backends.py): `@register_backend` on import, which refuses a name already
registered (AssertionError "duplicate name: hpu_backend"); the core imports it in either mode.

Habana's backend is AOTAutograd with its graph compilers; the fake traces the same way (AOTAutograd) and runs the
graphs on the emulated hpu device, counting each compiled graph in the graph_compilation metric. Uninstalling the
fake removes the registration.
"""

from habana_frameworks._fake import STATE as _STATE

import torch
from torch._dynamo.backends.registry import _BACKENDS, _COMPILER_FNS, register_backend

compiled_graphs = 0


def hpu_backend(graph_module, example_inputs, **kwargs):
    global compiled_graphs
    compiled_graphs += 1
    metric = _STATE.metrics["graph_compilation"]
    metric["TotalNumber"] += 1
    metric["AvgTime"] = metric["TotalTime"] / metric["TotalNumber"]
    _STATE.calls.record("habana_frameworks.torch.dynamo.compile_backend.hpu_backend",
                        (len(graph_module.graph.nodes),), {k: v for k, v in kwargs.items() if k == "options"})
    return torch._dynamo.lookup_backend("aot_eager")(graph_module, example_inputs)


_STATE.originals.setdefault("hpu_backend", (_COMPILER_FNS.get("hpu_backend"), _BACKENDS.get("hpu_backend")))
register_backend(name="hpu_backend")(hpu_backend)  # a name taken: "duplicate name: hpu_backend", as Habana's


def _skip_habana_in_traces():
    """As Habana's dynamo/trace_rules.py: TorchDynamo does not trace into habana_frameworks' Python (the fake's
    recorded wrappers included) when a compiled graph calls into torch.hpu."""
    import os

    from torch._dynamo import trace_rules

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))) + "/"
    if root not in trace_rules.SKIP_DIRS:
        trace_rules.SKIP_DIRS.append(root)
        trace_rules._recompile_re()
        _STATE.originals["dynamo skip dir"] = root


_skip_habana_in_traces()

"""The emulated Gaudi's fp8 engine: training as on a Gaudi; inference by measure / quantize, like Intel Neural
Compressor.

Training is not this module's: it goes through the transformer engine (hpu_nb.runtime.fp8.transformer_engine), here
the emulated `habana_frameworks...transformer_engine` built on hpu_nb.emulator.fp8.training (Fp8Linear, the fp8
state), exactly the path a Gaudi takes. What differs from a Gaudi is inference, below.

Inference: measuring hooks every selected module (INC's allowlist / blocklist rules) and records max |input|,
|weight|, |output|; the measurement document is written in INC's format ("Mode": "DynamicRange", "Nodes"). Quantizing
replaces each measured nn.Linear by Fp8QuantLinear: a static input scale from the measurement, the weight stored in
float8, per-tensor scales by the config's scale method as INC computes them on the emulated card's generation
(numerics.inc_scale: Gaudi2's e4m3 full scale 240 and its 4 hardware-aligned scales, Gaudi3's 448). What INC can do
and this emulation cannot (per-channel or optimised scales, other observers, other module types) is refused by name.
Each measure and quantize step is logged where INC logs on a Gaudi (`$HABANA_LOGS/inc_log.txt`: inc_log).
"""

from __future__ import annotations

import io
import json
import os
import re
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpu_nb.emulator.fp8 import inc_log
from hpu_nb.emulator.fp8.numerics import INC_BACKOFF, amax, inc_scale, quantize, scaled_mm
from hpu_nb.emulator.fp8.training import Fp8Linear, active_recipe, emulated_fp8_autocast, fp8_enabled  # noqa: F401
from hpu_nb.runtime.files import write_file_atomically
from hpu_nb.runtime.fp8 import Fp8Engine, Fp8EngineError
from hpu_nb.runtime.fp8.transformer_engine import TransformerEngineTraining

OUT_DTYPE = torch.bfloat16


# -- inference ---------------------------------------------------------------------------------------------------------
SUPPORTED_TYPES = ("Linear",)  # module types the emulated Gaudi measures and quantizes
SUPPORTED_OBSERVERS = ("maxabs",)
SCALE_METHODS = ("unit_scale", "maxabs_hw", "maxabs_pow2", "maxabs_arbitrary")  # per-tensor scales it computes
FP8_DTYPE = torch.float8_e4m3fn
WEIGHT_TOLERANCE = 0.01  # relative max-abs difference between the measured and the current weight


def selected_modules(model: torch.nn.Module, config: Mapping[str, Any]) -> dict[str, torch.nn.Module]:
    """Modules INC would patch, by qualified name: a supported type not blocked by type; allowed when the allowlist is
    empty or names its type or (regex) its name; not blocked by (regex) name."""
    allow, block = config["allowlist"], config["blocklist"]
    chosen = {}
    for name, module in model.named_modules():
        kind = type(module).__name__
        if not name or kind not in SUPPORTED_TYPES or kind in block["types"]:
            continue
        unrestricted = not allow["types"] and not allow["names"]
        allowed = unrestricted or kind in allow["types"] or _matches(allow["names"], name)
        if allowed and not _matches(block["names"], name):
            chosen[name] = module
    return chosen


def _matches(patterns: list[str], name: str) -> bool:
    return any(re.search(pattern, name) for pattern in patterns)


class _Recorder:
    """What measuring one model records: per module max |input|, |weight|, |output| and how often it ran."""

    def __init__(self, modules: dict[str, torch.nn.Module]) -> None:
        self.types = {name: type(m).__name__ for name, m in modules.items()}
        self.shapes = {name: list(m.weight.shape) for name, m in modules.items()}
        self.stats: dict[str, dict[str, float]] = {}
        self.hooks = [m.register_forward_hook(self._hook(name)) for name, m in modules.items()]

    def _hook(self, name: str) -> Any:
        def hook(module: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> None:
            record = self.stats.setdefault(name, {"input": 0.0, "weight": 0.0, "output": 0.0, "calls": 0})
            record["input"] = max(record["input"], float(amax(inputs[0])))
            record["weight"] = max(record["weight"], float(amax(module.weight)))
            record["output"] = max(record["output"], float(amax(output)))
            record["calls"] += 1

        return hook

    def document(self) -> dict[str, Any]:
        never_ran = sorted(set(self.types) - set(self.stats))
        nodes = {
            name: {"type": self.types[name], "shape": self.shapes[name], "calls": rec["calls"],
                   "inputs": [rec["input"]], "outputs": [rec["output"]], "params": {"weight": rec["weight"]}}
            for name, rec in sorted(self.stats.items())
        }
        return {"GlobalRank": None, "LocalRank": None, "Mode": "DynamicRange", "Observer": "maxabs", "Nodes": nodes,
                "NotRun": never_ran, "hpu_nb": {"pid": os.getpid(), "time": time.time(), "torch": torch.__version__}}


class Fp8QuantLinear(torch.nn.Module):
    """A measured nn.Linear run in fp8: static input scale from the measurements, weight stored in float8."""

    def __init__(self, linear: torch.nn.Linear, input_amax: float, scale_method: str) -> None:
        super().__init__()
        self.in_features, self.out_features, self.scale_method = linear.in_features, linear.out_features, scale_method
        weight = linear.weight.detach()
        # INC's scales (divisors, with its backoffs, on the emulated card's full scale and aligned scales), kept here
        # as the multipliers quantize() and scaled_mm() take
        w_scale = 1.0 / inc_scale(amax(weight), FP8_DTYPE, scale_method, INC_BACKOFF["weight"])
        in_amax = torch.tensor(input_amax, device=weight.device)
        in_scale = 1.0 / inc_scale(in_amax, FP8_DTYPE, scale_method, INC_BACKOFF["input"])
        self.register_buffer("weight_fp8", quantize(weight, w_scale, FP8_DTYPE))
        self.register_buffer("weight_scale", w_scale)
        self.register_buffer("input_scale", in_scale)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        out = scaled_mm(quantize(x2, self.input_scale, FP8_DTYPE), self.weight_fp8.t(), self.input_scale,
                        self.weight_scale, torch.float32)
        if self.bias is not None:
            out = out + self.bias.detach().float()
        return out.to(OUT_DTYPE).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, fp8=e4m3fn,"
                f" scale_method={self.scale_method}")


class EmulatedFp8Engine(TransformerEngineTraining, Fp8Engine):
    """fp8 on the emulated Gaudi: the transformer engine for training (the emulated te, the path a Gaudi takes),
    max-abs measurement and static quantization for inference."""

    name = "emulated transformer engine + measure / quantize (fp8 numerics on the CPU)"

    def __init__(self) -> None:
        self._recorders: weakref.WeakKeyDictionary[torch.nn.Module, _Recorder] = weakref.WeakKeyDictionary()

    # -- inference
    def check_inference_config(self, config: Mapping[str, Any]) -> None:
        problems = []
        if config["observer"] not in SUPPORTED_OBSERVERS:
            problems.append(f"observer {config['observer']!r} (it measures with {SUPPORTED_OBSERVERS})")
        if config["scale_method"] not in SCALE_METHODS:
            problems.append(f"scale_method {config['scale_method']!r} (it computes {', '.join(SCALE_METHODS)})")
        unsupported = sorted(set(config["allowlist"]["types"]) - set(SUPPORTED_TYPES))
        if unsupported:
            problems.append(f"allowlist types {unsupported} (it measures and quantizes {SUPPORTED_TYPES} modules)")
        if problems:
            raise Fp8EngineError("Intel Neural Compressor accepts these settings on a Gaudi, but the emulated Gaudi"
                                 " cannot run them: " + "; ".join(problems) + ".")

    def start_measurement(self, model: Any, config: Mapping[str, Any]) -> Any:
        modules = selected_modules(model, config)
        if not modules:
            raise Fp8EngineError(f"No module of {type(model).__name__} is selected for fp8 by the allowlist"
                                 f" {config['allowlist']} and blocklist {config['blocklist']}.")
        self._recorders[model] = _Recorder(modules)
        inc_log.log_step("measure", config, len(modules))
        return model

    def finish_measurement(self, model: Any, config: Mapping[str, Any], path: Path) -> Path:
        recorder = self._recorders.get(model)
        if recorder is None:
            raise Fp8EngineError(
                "This model is not being measured (convert_modules(..., inference=True, quant=False))."
            )
        if not recorder.stats:
            raise Fp8EngineError(
                "No fp8 measurements were recorded: run trainer.predict(model, ...) (or the model's forward) after "
                "convert_modules(model, inference=True, quant=False).")
        path.parent.mkdir(parents=True, exist_ok=True)
        document = recorder.document()
        # INC's three files from one base name (save_measure/save_files.py): the measurements as JSON and as a NumPy
        # archive, and the modules prepared for measuring, in the model's order, whether or not they ran (INC's
        # gmod_list); hpu_nb reads the JSON
        base = path.with_suffix("") if path.suffix == ".json" else path
        write_file_atomically(path, json.dumps(document, indent=1).encode())
        write_file_atomically(base.with_name(base.name + "_mod_list.json"), json.dumps(list(recorder.types)).encode())
        write_file_atomically(base.with_name(base.name + ".npz"), _npz_bytes(document))
        for hook in recorder.hooks:
            hook.remove()
        del self._recorders[model]
        return path

    def quantize(self, model: Any, config: Mapping[str, Any], measurements: Mapping[str, Any] | None) -> Any:
        assert measurements is not None
        modules = _check_against_measurements(model, config, measurements)
        inc_log.log_step("quantize", config, len(modules))
        for name, module in modules.items():
            node = measurements["Nodes"][name]
            _set_submodule(model, name, Fp8QuantLinear(module, float(node["inputs"][0]), config["scale_method"]))
        return model


def _npz_bytes(document: Mapping[str, Any]) -> bytes:
    """INC's archive: `np.savez(fname, d)`, the document as one object array `arr_0`, the measured values as arrays."""
    nodes = {name: {"inputs": [np.array(v, dtype=np.float32) for v in node["inputs"]],
                    "outputs": [np.array(v, dtype=np.float32) for v in node["outputs"]],
                    "params": {k: np.array(v, dtype=np.float32) for k, v in node["params"].items()}}
             for name, node in document["Nodes"].items()}
    buffer = io.BytesIO()
    np.savez(buffer, {**{k: v for k, v in document.items() if k != "Nodes"}, "Nodes": nodes})
    return buffer.getvalue()


def _check_against_measurements(model: torch.nn.Module, config: Mapping[str, Any],
                                document: Mapping[str, Any]) -> dict[str, torch.nn.Module]:
    """The selected modules, after checking they are exactly those measured (names, types, shapes, weights)."""
    modules = selected_modules(model, config)
    nodes = document["Nodes"]
    not_run = set(document.get("NotRun") or ())
    existing = {name for name, _ in model.named_modules()}  # measured but not selected now (a blocklist): not quantized
    problems = [f"{name!r} was measured but the model has no such module" for name in sorted(set(nodes) - existing)]
    problems += [f"{name!r} ({type(modules[name]).__name__}) has no measurements"
                 for name in sorted(set(modules) - set(nodes) - not_run)]
    for name in sorted(set(modules) & set(nodes)):
        module, node = modules[name], nodes[name]
        if type(module).__name__ != node.get("type", type(module).__name__):
            problems.append(f"{name!r} is a {type(module).__name__}, measured as a {node['type']}")
            continue
        if "shape" in node and list(module.weight.shape) != list(node["shape"]):
            problems.append(f"{name!r} has weight shape {list(module.weight.shape)}, measured {node['shape']}")
            continue
        measured, now = float(node["params"]["weight"]), float(amax(module.weight))
        if abs(now - measured) > WEIGHT_TOLERANCE * max(measured, 1e-12):
            problems.append(
                f"{name!r} weights changed since measuring (max |w| {now:.4g} now, {measured:.4g} measured)"
            )
    if problems:
        raise Fp8EngineError("The model does not match the fp8 measurements:\n  " + "\n  ".join(problems))
    return {name: modules[name] for name in nodes if name in modules}


def _set_submodule(model: torch.nn.Module, name: str, new: torch.nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)

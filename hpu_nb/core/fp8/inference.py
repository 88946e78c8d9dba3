"""fp8 inference in two steps, as on a Gaudi: measure (record max-abs statistics), then, in a fresh process, quantize.

Files under `fp8_data_path` use the Habana quantization config format (`mode`, `observer`, `scale_method`,
`allowlist`, `blocklist`, `dump_stats_path`): `maxabs_measure.json`, `maxabs_quant.json` and the statistics
`<dump_stats_path>_hooks_maxabs.json`. On a Gaudi the same steps are delegated to Intel Neural Compressor
(or HQT) through hpu_nb.runtime.habana_fp8; on the emulated Gaudi this module measures and quantizes itself.
"""

from __future__ import annotations

import json
import os
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

import torch

from hpu_nb.core.fp8.numerics import amax, quantize, scale_from_amax, scaled_mm

MEASURE_CONFIG = "maxabs_measure.json"
QUANT_CONFIG = "maxabs_quant.json"
STATS_SUFFIX = "_hooks_maxabs.json"
OBSERVER = "maxabs"
SCALE_METHODS = ("maxabs_hw", "maxabs_arbitrary", "unit_scale")
SUPPORTED_TYPES = ("Linear",)  # module types the emulated Gaudi measures and quantizes
FP8_DTYPE = torch.float8_e4m3fn
OUT_DTYPE = torch.bfloat16
WEIGHT_TOLERANCE = 0.01  # relative max-abs difference between the measured and the current weight


class Fp8InferenceError(RuntimeError):
    """fp8 measurement / quantization cannot proceed (files, process, or model mismatch)."""


_measured_in_this_process = False
_states: "weakref.WeakKeyDictionary[torch.nn.Module, Fp8InferenceState]" = weakref.WeakKeyDictionary()


# -- configuration ------------------------------------------------------------------------------------------------
def make_config(
    mode: str,
    dump_stats_path: str,
    *,
    allowlist: Optional[Mapping[str, list]] = None,
    blocklist: Optional[Mapping[str, list]] = None,
    scale_method: str = "maxabs_hw",
) -> dict:
    """A Habana quantization config (mode "MEASURE" or "QUANTIZE")."""
    if mode not in ("MEASURE", "QUANTIZE"):
        raise ValueError(f"mode={mode!r}; choose 'MEASURE' or 'QUANTIZE'.")
    return {
        "mode": mode,
        "observer": OBSERVER,
        "scale_method": scale_method,
        "allowlist": {"types": list((allowlist or {}).get("types", SUPPORTED_TYPES)),
                      "names": list((allowlist or {}).get("names", []))},
        "blocklist": {"types": list((blocklist or {}).get("types", [])),
                      "names": list((blocklist or {}).get("names", []))},
        "dump_stats_path": str(dump_stats_path),
    }


def data_dir(fp8_data_path: Optional[str]) -> Path:
    """Where measurements live: fp8_data_path, else HABANA_LOGS; never inside the installed hpu_nb package."""
    chosen = fp8_data_path or os.environ.get("HABANA_LOGS")
    if not chosen:
        raise ValueError("fp8 inference needs a place for measurements: pass fp8_data_path=... (or set HABANA_LOGS).")
    path = Path(chosen).expanduser().resolve()
    package = Path(__file__).resolve().parents[2]
    if path == package or package in path.parents:
        raise ValueError(f"fp8_data_path={str(chosen)!r} is inside the installed hpu_nb package ({package}); choose a "
                         f"directory of your own.")
    return path


def stats_file(config: Mapping[str, Any]) -> Path:
    return Path(str(config["dump_stats_path"]) + STATS_SUFFIX)


def _read_measure_output(path: Path, missing: str) -> Any:
    """A JSON file the measure step writes; when missing or broken, the error says how to make it."""
    if not path.is_file():
        raise FileNotFoundError(
            missing.format(path=path) + ". Measure first, in another process: "
            "convert_modules(model, inference=True, quant=False, fp8_data_path=...) then trainer.predict(...)."
        )
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise Fp8InferenceError(f"{path} is not valid JSON ({err}).") from err


def read_config(path: Path, expected_mode: str) -> dict:
    """Load and check a quantization config JSON; errors name the file and the field."""
    config = _read_measure_output(path, "fp8 quantization config {path} does not exist")
    missing = [k for k in ("mode", "observer", "scale_method", "allowlist", "blocklist", "dump_stats_path")
               if k not in config]
    if missing:
        raise Fp8InferenceError(f"{path} lacks the field(s) {missing} of a Habana quantization config.")
    if str(config["mode"]).upper() != expected_mode:
        raise Fp8InferenceError(f"{path} has mode {config['mode']!r}, but this step needs mode {expected_mode!r}.")
    if config["observer"] != OBSERVER:
        raise Fp8InferenceError(f"{path}: observer {config['observer']!r} is not supported; use {OBSERVER!r}.")
    if config["scale_method"] not in SCALE_METHODS:
        raise Fp8InferenceError(f"{path}: scale_method {config['scale_method']!r}; choose one of {SCALE_METHODS}.")
    return config


def selected_modules(model: torch.nn.Module, config: Mapping[str, Any]) -> dict[str, torch.nn.Module]:
    """Modules the allowlist admits and the blocklist does not, by qualified name."""
    allow, block = config.get("allowlist", {}), config.get("blocklist", {})
    allow_types = set(allow.get("types") or SUPPORTED_TYPES)
    allow_names = set(allow.get("names") or ())
    block_types, block_names = set(block.get("types") or ()), set(block.get("names") or ())
    chosen = {}
    for name, module in model.named_modules():
        kind = type(module).__name__
        if not name or kind not in allow_types or kind in block_types or name in block_names:
            continue
        if allow_names and name not in allow_names:
            continue
        chosen[name] = module
    return chosen


# -- state kept per converted model -------------------------------------------------------------------------------
@dataclass
class Fp8InferenceState:
    """What convert_modules(inference=True) set up for one model."""

    mode: str  # "measure" or "quantize"
    backend: str  # "emulated", "inc" or "hqt"
    data_path: Path
    config: dict
    stats: dict[str, dict[str, float]] = field(default_factory=dict)  # name -> {"input", "weight", "output", "calls"}
    shapes: dict[str, list[int]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)
    hooks: list[Any] = field(default_factory=list)
    written: Optional[Path] = None


def state_of(module: torch.nn.Module) -> Optional[Fp8InferenceState]:
    return _states.get(module)


# -- emulated measurement ---------------------------------------------------------------------------------------
def _unsupported(model: torch.nn.Module, config: Mapping[str, Any]) -> list[str]:
    asked = set(config.get("allowlist", {}).get("types") or ())
    return sorted(asked - set(SUPPORTED_TYPES))


def start_measurement(model: torch.nn.Module, data_path: Path, config: dict) -> Fp8InferenceState:
    """Hook every selected module to record max |input|, |weight|, |output| while the model predicts."""
    global _measured_in_this_process
    unsupported = _unsupported(model, config)
    if unsupported:
        raise Fp8InferenceError(f"The emulated Gaudi measures only {SUPPORTED_TYPES} modules; allowlist types "
                                f"{unsupported} are not supported.")
    modules = selected_modules(model, config)
    if not modules:
        raise Fp8InferenceError(f"No module of {type(model).__name__} matches the allowlist {config['allowlist']} "
                                f"(blocklist {config['blocklist']}).")
    state = Fp8InferenceState("measure", "emulated", data_path, config)
    for name, module in modules.items():
        state.types[name] = type(module).__name__
        state.shapes[name] = list(module.weight.shape)
        state.hooks.append(module.register_forward_hook(_measure_hook(state, name)))
    _measured_in_this_process = True
    return state


def _measure_hook(state: Fp8InferenceState, name: str) -> Any:
    def hook(module: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        record = state.stats.setdefault(name, {"input": 0.0, "weight": 0.0, "output": 0.0, "calls": 0})
        record["input"] = max(record["input"], float(amax(inputs[0])))
        record["weight"] = max(record["weight"], float(amax(module.weight)))
        record["output"] = max(record["output"], float(amax(output)))
        record["calls"] += 1

    return hook


def write_measurements(state: Fp8InferenceState) -> Path:
    """Write the statistics in the Habana format (atomically); error if no selected module ever ran."""
    never_ran = sorted(set(state.types) - set(state.stats))
    if len(never_ran) == len(state.types):
        raise Fp8InferenceError(
            "No fp8 measurements were recorded: run trainer.predict(model, ...) (or the model's forward) after "
            "convert_modules(model, inference=True, quant=False)."
        )
    nodes = {
        name: {
            "type": state.types[name],
            "shape": state.shapes[name],
            "calls": rec["calls"],
            "inputs": [rec["input"]],
            "outputs": [rec["output"]],
            "params": {"weight": rec["weight"]},
        }
        for name, rec in sorted(state.stats.items())
    }
    document = {
        "GlobalRank": None,
        "LocalRank": None,
        "Mode": "DynamicRange",
        "Observer": OBSERVER,
        "Nodes": nodes,
        "NotRun": never_ran,
        "hpu_nb": {"pid": os.getpid(), "time": time.time(), "torch": torch.__version__},
    }
    path = stats_file(state.config)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(document, indent=1), encoding="utf-8")
    tmp.replace(path)
    state.written = path
    return path


def read_measurements(path: Path) -> dict:
    document = _read_measure_output(path, "fp8 measurements {path} do not exist")
    if document.get("Mode") != "DynamicRange" or not isinstance(document.get("Nodes"), dict):
        raise Fp8InferenceError(f"{path} is not a max-abs measurement file (expected 'Mode': 'DynamicRange' and "
                                f"'Nodes').")
    for name, node in document["Nodes"].items():
        try:
            float(node["inputs"][0]), float(node["params"]["weight"]), list(node["shape"])
        except (KeyError, IndexError, TypeError, ValueError):
            raise Fp8InferenceError(f"{path}: node {name!r} lacks inputs / params.weight / shape.") from None
    return document


# -- emulated quantization ----------------------------------------------------------------------------------------
class Fp8QuantLinear(torch.nn.Module):
    """A measured nn.Linear run in fp8: static input scale from the measurements, weight stored in float8."""

    def __init__(self, linear: torch.nn.Linear, input_amax: float, scale_method: str) -> None:
        super().__init__()
        self.in_features, self.out_features, self.scale_method = linear.in_features, linear.out_features, scale_method
        pow2 = scale_method == "maxabs_hw"  # Gaudi's hardware scales are powers of two
        unit = scale_method == "unit_scale"
        weight = linear.weight.detach()
        one = torch.ones((), device=weight.device)
        w_scale = one if unit else scale_from_amax(amax(weight), FP8_DTYPE, power_of_two=pow2)
        in_scale = one if unit else scale_from_amax(torch.tensor(input_amax, device=weight.device), FP8_DTYPE,
                                                    power_of_two=pow2)
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
        return (f"in_features={self.in_features}, out_features={self.out_features}, fp8=e4m3fn, "
                f"scale_method={self.scale_method}")


def check_against_stats(
    model: torch.nn.Module, config: Mapping[str, Any], document: dict, path: Path
) -> dict[str, torch.nn.Module]:
    """The selected modules, after checking they are exactly those measured (names, types, shapes, weights)."""
    modules = selected_modules(model, config)
    nodes = document["Nodes"]
    measured_not_run = set(document.get("NotRun") or ())
    problems = []
    for name in sorted(set(nodes) - set(modules)):
        problems.append(f"{name!r} was measured but the model has no such selected module")
    for name in sorted(set(modules) - set(nodes) - measured_not_run):
        problems.append(f"{name!r} ({type(modules[name]).__name__}) has no measurements")
    for name in sorted(set(modules) & set(nodes)):
        module, node = modules[name], nodes[name]
        if type(module).__name__ != node.get("type", type(module).__name__):
            problems.append(f"{name!r} is a {type(module).__name__}, measured as a {node['type']}")
            continue
        if list(module.weight.shape) != list(node["shape"]):
            problems.append(f"{name!r} has weight shape {list(module.weight.shape)}, measured {node['shape']}")
            continue
        measured, now = float(node["params"]["weight"]), float(amax(module.weight))
        if abs(now - measured) > WEIGHT_TOLERANCE * max(measured, 1e-12):
            problems.append(f"{name!r} weights changed since measuring (max |w| {now:.4g} now, {measured:.4g} "
                            f"measured)")
    if problems:
        raise Fp8InferenceError(f"The model does not match the fp8 measurements in {path}:\n  " + "\n  ".join(problems))
    return {name: modules[name] for name in nodes}


def quantize_model(model: torch.nn.Module, data_path: Path, config: dict) -> Fp8InferenceState:
    """Replace every measured module by its fp8 version (emulated Gaudi)."""
    if _measured_in_this_process:
        raise Fp8InferenceError(
            "fp8 measurement and quantization cannot run in one process (as on a Gaudi): this process measured. "
            "Restart the kernel (or run a new process) and call convert_modules(..., quant=True) there."
        )
    path = stats_file(config)
    document = read_measurements(path)
    if document.get("hpu_nb", {}).get("pid") == os.getpid():
        raise Fp8InferenceError(f"{path} was written by this process; quantize in a fresh process.")
    unsupported = _unsupported(model, config)
    if unsupported:
        raise Fp8InferenceError(f"The emulated Gaudi quantizes only {SUPPORTED_TYPES} modules; allowlist types "
                                f"{unsupported} are not supported.")
    modules = check_against_stats(model, config, document, path)
    for name, module in modules.items():
        replacement = Fp8QuantLinear(module, float(document["Nodes"][name]["inputs"][0]), config["scale_method"])
        _set_submodule(model, name, replacement)
    return Fp8InferenceState("quantize", "emulated", data_path, config)


def _set_submodule(model: torch.nn.Module, name: str, new: torch.nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


# -- entry points ---------------------------------------------------------------------------------------------------
def prepare_inference(
    model: torch.nn.Module, quant: bool, fp8_data_path: Optional[str], gaudi: bool
) -> torch.nn.Module:
    """Set `model` up to measure (quant=False) or to run quantized (quant=True); returns the model to use."""
    global _measured_in_this_process
    path = data_dir(fp8_data_path)
    dump = path / "measure"
    user_config = os.environ.get("QUANT_CONFIG")
    mode = "QUANTIZE" if quant else "MEASURE"
    if user_config:
        config = read_config(Path(user_config), mode)
    elif quant:
        config = read_config(path / QUANT_CONFIG, "QUANTIZE")
    else:
        path.mkdir(parents=True, exist_ok=True)
        config = make_config("MEASURE", str(dump))
        for name, cfg in ((MEASURE_CONFIG, config), (QUANT_CONFIG, make_config("QUANTIZE", str(dump)))):
            (path / name).write_text(json.dumps(cfg, indent=1), encoding="utf-8")

    if not gaudi:
        state = quantize_model(model, path, config) if quant else start_measurement(model, path, config)
        _states[model] = state
        return model

    from hpu_nb.runtime import habana_fp8

    if quant and _measured_in_this_process:
        raise Fp8InferenceError("fp8 measurement and quantization cannot run in one process: restart and quantize "
                                "there.")
    tool = habana_fp8.inference_toolkit()
    if not tool:
        raise ImportError("fp8 inference on a Gaudi needs Intel Neural Compressor (neural-compressor) or "
                          "habana-quantization-toolkit.")
    if tool == "inc":
        model = habana_fp8.inc_convert(model, config) if quant else habana_fp8.inc_prepare(model, config)
    else:
        config_path = Path(user_config) if user_config else path / (QUANT_CONFIG if quant else MEASURE_CONFIG)
        model = habana_fp8.hqt_prep_model(model, str(config_path))
    if not quant:
        _measured_in_this_process = True
    _states[model] = Fp8InferenceState("quantize" if quant else "measure", tool, path, config)
    return model


def finalize_measurements(module: Optional[torch.nn.Module] = None) -> list[Path]:
    """Write the measurements of `module` (or of every model measuring in this process); returns the files written."""
    targets = [(module, _states.get(module))] if module is not None else list(_states.items())
    written = []
    for model, state in targets:
        if state is None or state.mode != "measure":
            continue
        if state.backend == "emulated":
            written.append(write_measurements(state))
            continue
        from hpu_nb.runtime import habana_fp8

        if state.backend == "inc":
            habana_fp8.inc_finalize(model)
        else:
            habana_fp8.hqt_finish(model)
        written.append(stats_file(state.config))
    return written

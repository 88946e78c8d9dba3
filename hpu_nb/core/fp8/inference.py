"""fp8 inference in two steps, as on a Gaudi: measure (record max-abs statistics), then quantize.

The two steps may run in one process, as lightning-habana's tests and its mnist example do (the same model, or a
fresh one, converted for quantize after measuring): measurements of this process not yet written are written first.

Configs are Intel Neural Compressor's fp8 config JSON, read as INC reads it (neural_compressor/torch/algorithms/
fp8_quant/_quant_common/quant_config.py): every key is optional (mode QUANTIZE, observer maxabs, scale_method
maxabs_hw, empty allowlist / blocklist), names are case-insensitive, the old whitelist / blacklist keys still count,
other keys pass through to INC. So the configs optimum-habana ships (maxabs_measure.json: mode, observer and
dump_stats_path only) are accepted. A config that is not an object of such settings is an error naming the file.

Files (lightning-habana's layout): `<fp8_data_path>/maxabs_measure.json` and `maxabs_quant.json` (written when
measuring), and the measurements `<fp8_data_path>/inc_output/measure_hooks_maxabs[_<rank>_<world>].json`. As
lightning-habana did, the measurement path always comes from the fp8_data_path given to this step, never from a path a
config recorded earlier (a moved folder still works; a stale old folder is never read). As INC does, the rank suffix
is fixed when the model is converted: a process that knows its rank then (torch.distributed, or LOCAL_RANK /
WORLD_SIZE) reads and writes `_<rank>_<world>`, otherwise the file without a suffix.

Without fp8_data_path the directory is $HABANA_LOGS, else `<hpu_nb cache directory>/fp8` ($HPU_NB_CACHE_DIR, else
~/.cache/hpu_nb; the same for the measuring and the quantizing process), as the plugin's example passes no path; which
one was chosen is logged once.

The measurement and quantization themselves are the device's fp8 engine's (Intel Neural Compressor on a Gaudi, the
emulation otherwise); the measurements are written while the model is still on the device (the strategies call
`finalize_measurements` in on_predict_end / on_test_end, as lightning-habana did).
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import warnings
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from hpu_nb.runtime import get_backend
from hpu_nb.runtime.files import (
    UnreadableFileError,
    check_named_file,
    read_small_file,
    write_file_atomically,
    write_temporary_beside,
)
from hpu_nb.runtime.fp8 import Fp8EngineError

MEASURE_CONFIG = "maxabs_measure.json"
QUANT_CONFIG = "maxabs_quant.json"
QUANT_CONFIG_ENV = "QUANT_CONFIG"
DUMP_STATS_SUBPATH = ("inc_output", "measure")
DEFAULT_SUBDIR = "fp8"  # under hpu_nb's cache directory, when neither fp8_data_path nor HABANA_LOGS is given
MODES = ("QUANTIZE", "MEASURE", "SHAPE", "LOAD", "NONE")  # INC's QuantMode; hpu_nb runs MEASURE and QUANTIZE
OBSERVERS = ("maxabs", "maxabs_per_channel", "shape", "save")
SCALE_METHODS = (  # INC's ScaleMethodString names, lower-cased
    "unit_scale", "hw_aligned_single_scale", "maxabs_hw", "maxabs_pow2", "act_maxabs_hw_weights_pcs_maxabs_pow2",
    "act_maxabs_hw_weights_pcs_opt_pow2", "act_maxabs_pow2_weights_pcs_maxabs_pow2",
    "act_maxabs_pow2_weights_pcs_opt_pow2", "maxabs_hw_opt_weight", "maxabs_pow2_opt_weight", "maxabs_arbitrary",
    "act_maxabs_pcs_pow2_weight_maxabs_pts_pow2_hw", "maxabs_pcs_pow2",
)
LIST_KEYS = {"allowlist": "allowlist", "blocklist": "blocklist", "whitelist": "allowlist", "blacklist": "blocklist"}


class Fp8InferenceError(RuntimeError):
    """fp8 measurement / quantization cannot proceed (files, process, or model mismatch)."""


_announced: set[tuple[str, Path]] = set()  # directories chosen without fp8_data_path, said once each


@dataclass
class Fp8InferenceState:
    """What convert_modules(inference=True) set up for one model."""

    mode: str  # "measure" or "quantize"
    data_path: Path
    config: dict[str, Any]
    rank_world: tuple[int, int] | None  # fixed at conversion, as INC fixes it
    written: Path | None = None


_states: weakref.WeakKeyDictionary[torch.nn.Module, Fp8InferenceState] = weakref.WeakKeyDictionary()


def state_of(module: torch.nn.Module) -> Fp8InferenceState | None:
    return _states.get(module)


# -- configuration ------------------------------------------------------------------------------------------------
def make_config(mode: str, dump_stats_path: str, *, allowlist: Mapping[str, list[str]] | None = None,
                blocklist: Mapping[str, list[str]] | None = None, scale_method: str = "maxabs_hw") -> dict[str, Any]:
    """hpu_nb's default config for a step (mode "MEASURE" or "QUANTIZE"), as lightning-habana shipped them."""
    if mode not in ("MEASURE", "QUANTIZE"):
        raise ValueError(f"mode={mode!r}; choose 'MEASURE' or 'QUANTIZE'.")
    config = {"mode": mode, "observer": "maxabs",
              "allowlist": {"types": list((allowlist or {}).get("types", [])),
                            "names": list((allowlist or {}).get("names", []))},
              "blocklist": {"types": list((blocklist or {}).get("types", [])),
                            "names": list((blocklist or {}).get("names", []))},
              "dump_stats_path": str(dump_stats_path)}
    if mode == "QUANTIZE":
        config["scale_method"] = scale_method
    return config


def normalize_config(raw: Any, origin: str) -> dict[str, Any]:
    """An fp8 config with every setting filled in as INC would; an error naming `origin` and the key otherwise."""
    if not isinstance(raw, Mapping):
        kinds = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}
        kind = kinds.get(type(raw), type(raw).__name__)
        raise Fp8InferenceError(f"{origin} is a JSON {kind}, not an object of fp8 settings such as"
                                ' {"mode": "MEASURE", "observer": "maxabs", "dump_stats_path": "..."}.')
    config = {key: copy.deepcopy(value) for key, value in raw.items() if key not in LIST_KEYS}
    config["mode"] = _choice(raw.get("mode", "QUANTIZE"), MODES, "mode", origin).upper()
    config["observer"] = _choice(raw.get("observer", "maxabs"), OBSERVERS, "observer", origin)
    method = raw.get("scale_method", "maxabs_hw")
    config["scale_method"] = (method if isinstance(method, Mapping)
                              else _choice(method, SCALE_METHODS, "scale_method", origin))
    for name in ("allowlist", "blocklist"):
        config[name] = {"types": [], "names": []}
    for key, target in LIST_KEYS.items():
        if key in raw:
            config[target].update(_list_setting(raw[key], key, origin))
    path = raw.get("dump_stats_path")
    if path is not None and not isinstance(path, str):
        raise Fp8InferenceError(f"{origin}: dump_stats_path must be a string path, got {path!r}.")
    return config


def _choice(value: Any, choices: tuple[str, ...], key: str, origin: str) -> str:
    if not isinstance(value, str) or value.strip().lower() not in {c.lower() for c in choices}:
        raise Fp8InferenceError(
            f"{origin}: {key} {value!r} is not one of Intel Neural Compressor's: {', '.join(choices)}."
        )
    return value.strip().lower()


def _list_setting(value: Any, key: str, origin: str) -> dict[str, list[str]]:
    shape = '{"types": ["Linear"], "names": ["lm_head"]}'
    if not isinstance(value, Mapping):
        raise Fp8InferenceError(f"{origin}: {key} must be an object like {shape}, not {value!r}.")
    unknown = sorted(set(value) - {"types", "names"})
    if unknown:
        raise Fp8InferenceError(f"{origin}: {key} has unknown keys {unknown}; it takes types and names, e.g. {shape}.")
    result = {}
    for field, items in value.items():
        if not isinstance(items, (list, tuple)) or not all(isinstance(item, str) for item in items):
            raise Fp8InferenceError(f"{origin}: {key}.{field} must be a list of strings, e.g. {shape}, not {items!r}.")
        result[field] = list(items)
    return result


def default_data_dir() -> Path:
    """Where measurements live when neither fp8_data_path nor HABANA_LOGS says: `<hpu_nb cache directory>/fp8`.

    The cache directory is $HPU_NB_CACHE_DIR, else $XDG_CACHE_HOME/hpu_nb, else ~/.cache/hpu_nb: the same for the
    measuring and the quantizing process."""
    from hpu_nb.runtime import cache_dir  # noqa: PLC0415 -- lazy: it loads the emulated device's build module

    base: Path = cache_dir()  # the runtime's lazy attribute (typed Any there)
    return base / DEFAULT_SUBDIR


def data_dir(fp8_data_path: str | None) -> Path:
    """Where measurements live: fp8_data_path; else $HABANA_LOGS; else `<hpu_nb cache directory>/fp8`
    (default_data_dir). Never inside the installed hpu_nb package. When it was not given, says once which it chose."""
    if fp8_data_path:
        chosen, why = fp8_data_path, None
    elif os.environ.get("HABANA_LOGS"):
        chosen, why = os.environ["HABANA_LOGS"], "$HABANA_LOGS"
    else:
        chosen, why = str(default_data_dir()), "hpu_nb's default, <cache directory>/fp8; set HABANA_LOGS to change it"
    path = Path(chosen).expanduser().resolve()
    package = Path(__file__).resolve().parents[2]
    if path == package or package in path.parents:
        raise ValueError(f"fp8_data_path={str(chosen)!r} is inside the installed hpu_nb package ({package}); choose a"
                         " directory of your own.")
    if why is not None and (why, path) not in _announced:
        _announced.add((why, path))
        rank_zero_info(f"fp8 inference: no fp8_data_path given; measurements live in {path} ({why}).")
    return path


def dump_stats_path(path: Path) -> Path:
    """The measurement path for a data directory (what lightning-habana patched into every config)."""
    return path.joinpath(*DUMP_STATS_SUBPATH)


def _read_json(path: Path, what: str, *, made_by_measuring: bool) -> Any:
    """A JSON file the measure step writes or the user names, read through the one bounded reader: a folder, a
    device, a FIFO or a huge file is refused for what it is, without blocking. A missing file is FileNotFoundError;
    for one the measure step makes, it says how to make it."""
    if not path.exists():  # stat only: it neither opens nor blocks on a FIFO
        hint = (". Measure first, in another process: convert_modules(model, inference=True, quant=False,"
                " fp8_data_path=...) then trainer.predict(...)." if made_by_measuring else ".")
        # what the measure step writes: lightning-habana's words first (Intel Neural Compressor's "Failed to load")
        failed = f"Failed to load file {path}: " if made_by_measuring else ""
        raise FileNotFoundError(f"{failed}{what} {path} does not exist{hint}")
    try:
        return json.loads(read_small_file(path, what))
    except UnreadableFileError as err:
        raise Fp8InferenceError(str(err)) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise Fp8InferenceError(f"{path} is not valid JSON ({err}).") from err


def read_config(path: Path, what: str = "fp8 quantization config", *, made_by_measuring: bool = True) -> dict[str, Any]:
    """An fp8 config file; `what` says whose it is (the measure step's, or one the user named)."""
    return normalize_config(_read_json(path, what, made_by_measuring=made_by_measuring), str(path))


# -- ranks and measurement files ------------------------------------------------------------------------------------
def rank_and_world() -> tuple[int, int] | None:
    """(rank, world size) as Intel Neural Compressor reads them (torch.distributed, else LOCAL_RANK / WORLD_SIZE)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if os.environ.get("LOCAL_RANK") is not None:
        return int(os.environ["LOCAL_RANK"]), int(os.environ.get("WORLD_SIZE") or 1)
    return None


def measurement_file(config: Mapping[str, Any], rank_world: tuple[int, int] | None) -> Path:
    """INC's name for the measurements: `<dump_stats_path>_hooks_<observer>[_<rank>_<world>].json`."""
    suffix = "" if rank_world is None else f"_{rank_world[0]}_{rank_world[1]}"
    return Path(f"{config['dump_stats_path']}_hooks_{config['observer']}{suffix}.json")


def _present_measurements(config: Mapping[str, Any]) -> list[str]:
    base = Path(str(config["dump_stats_path"]) + f"_hooks_{config['observer']}")
    if not base.parent.is_dir():
        return []
    return sorted(p.name for p in base.parent.glob(base.name + "*.json") if not p.name.endswith("_mod_list.json"))


def read_measurements(path: Path) -> dict[str, Any]:
    """A max-abs measurement document, every amax checked to be a finite, non-negative number."""
    document = _read_json(path, "fp8 measurement file", made_by_measuring=True)
    if (not isinstance(document, dict) or document.get("Mode") != "DynamicRange"
            or not isinstance(document.get("Nodes"), dict)):
        raise Fp8InferenceError(f"{path} is not a max-abs measurement file (expected an object with 'Mode':"
                                " 'DynamicRange' and 'Nodes').")
    for name, node in document["Nodes"].items():
        try:
            values = {"inputs": node["inputs"][0], "params.weight": node["params"]["weight"]}
            if node.get("outputs"):
                values["outputs"] = node["outputs"][0]
        except (KeyError, IndexError, TypeError):
            raise Fp8InferenceError(f"{path}: node {name!r} lacks inputs / params.weight.") from None
        for what, value in values.items():
            amax = _amax(value)
            if amax is None or not math.isfinite(amax) or amax < 0:
                raise Fp8InferenceError(f"{path}: node {name!r} has {what} = {value!r}, not a finite max-abs >= 0; the"
                                        " measurement is broken: measure again.")
        node["inputs"][0] = _amax(node["inputs"][0])
        node["params"]["weight"] = _amax(node["params"]["weight"])
    return document


def _amax(value: Any) -> float | None:
    """A measured max-abs as a float (INC writes a number, or a list of one); None when it is neither."""
    while isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


# -- entry points ---------------------------------------------------------------------------------------------------
def _step_config(path: Path, quant: bool | str | dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The config of this step and the mode it asks for."""
    if isinstance(quant, bool):
        mode = "QUANTIZE" if quant else "MEASURE"
        user = os.environ.get(QUANT_CONFIG_ENV)
        if user:
            config = read_config(Path(user), f"{QUANT_CONFIG_ENV} file", made_by_measuring=False)
            if config["mode"] != mode:
                raise Fp8InferenceError(
                    f"{QUANT_CONFIG_ENV}={user} has mode {config['mode']!r} (INC's default when none is given is"
                    f" QUANTIZE), but this step needs mode {mode!r} (quant={quant}). Point {QUANT_CONFIG_ENV} at the"
                    " config of this step, or pass it as quant=<path>.")
        elif quant:
            config = read_config(path / QUANT_CONFIG)
        else:
            config = normalize_config(make_config("MEASURE", str(dump_stats_path(path))), "hpu_nb's measure config")
        return config, mode
    if isinstance(quant, (str, os.PathLike)):
        config = read_config(Path(quant), "quant= config file", made_by_measuring=False)
    elif isinstance(quant, Mapping):
        config = normalize_config(quant, "the quant= config")
    else:
        raise TypeError(f"`quant` must be either a bool, file path or a dictionary. Got {type(quant)}: quant=True"
                        " quantizes, quant=False measures, or pass an fp8 config file path or dict.")
    if config["mode"] not in ("MEASURE", "QUANTIZE"):
        raise Fp8InferenceError(f"fp8 config mode {config['mode']!r}: hpu_nb runs MEASURE and QUANTIZE steps.")
    return config, config["mode"]


@dataclass(frozen=True)
class InferencePlan:
    """What convert_modules(inference=True) decided before touching a model: the step, its directory and config.

    Made up front (so a missing config, an unusable setting or quantizing after measuring fail at once) and applied to
    the model then or, with DeepSpeed, once DeepSpeed has wrapped it (`apply_inference`)."""

    mode: str  # "MEASURE" or "QUANTIZE"
    path: Path
    config: dict[str, Any]


def plan_inference(quant: bool | str | dict[str, Any], fp8_data_path: str | None) -> InferencePlan:
    """The fp8 inference step `quant` asks for (the config's mode decides), checked against the engine in force."""
    path = data_dir(fp8_data_path)
    config, mode = _step_config(path, quant)
    config["dump_stats_path"] = str(dump_stats_path(path))  # from this step's fp8_data_path, always
    try:
        get_backend().fp8_engine().check_inference_config(config)
    except Fp8EngineError as err:
        raise Fp8InferenceError(str(err)) from None
    _record_dump_stats_path(quant, config["dump_stats_path"])
    return InferencePlan(mode, path, config)


def _record_dump_stats_path(quant: bool | str | dict[str, Any], measurements: str) -> None:
    """Write the measurement path of this step into the user's config (their dict, or their JSON file), as
    lightning-habana did before handing it to Intel Neural Compressor: code that reads `dump_stats_path` back from its
    config afterwards finds where the measurements are. hpu_nb itself never reads it back (every step takes the path
    from its own fp8_data_path)."""
    if isinstance(quant, bool):
        return
    if isinstance(quant, dict):
        quant["dump_stats_path"] = measurements
    elif isinstance(quant, (str, os.PathLike)):
        patch_json_file(Path(quant), {"dump_stats_path": measurements})


def patch_json_file(path: Path, patch: Mapping[str, Any]) -> None:
    """Set `patch`'s entries in the JSON object stored at `path`, in place (read through the bounded reader; written
    to a temporary file renamed over it, so a reader never sees half a file)."""
    document = _read_json(path, "JSON file", made_by_measuring=False)
    if not isinstance(document, dict):
        raise Fp8InferenceError(f"{path} holds a JSON {type(document).__name__}, not an object: it cannot be patched.")
    document.update(patch)
    write_file_atomically(path, json.dumps(document, indent=1))


def _measurements_written_first(model: torch.nn.Module, config: Mapping[str, Any]) -> None:
    """Before quantizing in a process that measured, write this process's measurements of the same file that are not
    written yet: the model's own (lightning-habana's mnist example quantizes the very model it measured, as INC's
    prepare / convert flow allows; its measuring hooks come off when they are written), and other models'."""
    target = Path(config["dump_stats_path"])
    for other, other_state in list(_states.items()):
        if (other_state.mode == "measure" and other_state.written is None
                and Path(other_state.config["dump_stats_path"]) == target):
            if other is model:
                finalize_measurements(other)  # nothing recorded (never ran) is an error naming the fix
            else:
                with contextlib.suppress(Fp8InferenceError):  # converted to measure but never run: nothing to write
                    finalize_measurements(other)


def prepare_inference(
    model: torch.nn.Module, quant: bool | str | dict[str, Any], fp8_data_path: str | None
) -> torch.nn.Module:
    """Set `model` up to measure or to run quantized (the config's mode decides); returns the model to use."""
    return apply_inference(model, plan_inference(quant, fp8_data_path))


def apply_inference(model: torch.nn.Module, plan: InferencePlan) -> torch.nn.Module:
    """Set `model` up for a planned step: measure (hooks, config files written) or quantize from the measurements.

    The rank suffix of the measurement file is fixed here, as INC fixes it when it converts. Returns the model to use.
    """
    path, config = plan.path, copy.deepcopy(plan.config)
    engine = get_backend().fp8_engine()
    rank_world = rank_and_world()
    if plan.mode == "QUANTIZE":
        _measurements_written_first(model, config)
        expected = measurement_file(config, rank_world)
        if not expected.exists():  # stat only; what it is (a folder, a FIFO) is checked below, without blocking
            present = _present_measurements(config)
            where = (f" Found instead: {', '.join(present)}: measurements are named by the rank and world size the"
                     " measuring process knew when the model was converted; quantize with the same devices and"
                     " launcher." if present else "")
            raise FileNotFoundError(
                f"Failed to load file {expected}: fp8 measurements {expected} do not exist.{where} Measure first, in"
                " another process: convert_modules("
                "model, inference=True, quant=False, fp8_data_path=...) then trainer.predict(...).")
        if engine.reads_measurements_itself:  # Intel Neural Compressor opens it: make sure it is a file it can read
            try:
                check_named_file(expected, "fp8 measurement file")
            except UnreadableFileError as err:
                raise Fp8InferenceError(str(err)) from None
            measurements = None
        else:
            measurements = read_measurements(expected)
        try:
            model = engine.quantize(model, config, measurements)
        except Fp8EngineError as err:
            raise Fp8InferenceError(f"{err} (measurements: {expected})") from None
        _states[model] = Fp8InferenceState("quantize", path, config, rank_world)
        return model
    quant_config = {**config, "mode": "QUANTIZE"}
    quant_config.setdefault("scale_method", "maxabs_hw")
    with _files_if_it_succeeds(path, {MEASURE_CONFIG: config, QUANT_CONFIG: quant_config}):
        try:
            model = engine.start_measurement(model, config)
        except Fp8EngineError as err:
            raise Fp8InferenceError(str(err)) from None
    _states[model] = Fp8InferenceState("measure", path, config, rank_world)
    return model


@contextlib.contextmanager
def _files_if_it_succeeds(directory: Path, documents: Mapping[str, Any]) -> Iterator[None]:
    """Write `documents` (file name -> JSON) into `directory` only if the block succeeds: all or nothing.

    Each is written to a temporary file first and renamed over its name once the block returned, so a conversion
    that fails leaves no maxabs_*.json of its own and the files of an earlier good measurement as they were."""
    directory.mkdir(parents=True, exist_ok=True)
    temporaries: dict[Path, Path] = {}
    try:
        for name, document in documents.items():
            temporaries[write_temporary_beside(directory / name, json.dumps(document, indent=1))] = directory / name
        yield
        for temporary, final in list(temporaries.items()):
            temporary.replace(final)  # a rename within one folder: atomic
            del temporaries[temporary]
    finally:
        for temporary in temporaries:  # the block or a write failed: what this step wrote goes
            temporary.unlink(missing_ok=True)


def finalize_measurements(module: torch.nn.Module | None = None) -> list[Path]:
    """Write the measurements of `module` (or of every model measuring in this process) while it is still on the
    device; returns the files written. Models already written are skipped."""
    targets = [(module, _states.get(module))] if module is not None else list(_states.items())
    written = []
    engine = get_backend().fp8_engine()
    for model, state in targets:
        if state is None or state.mode != "measure" or state.written is not None:
            continue
        now = rank_and_world()
        if state.rank_world is None and now is not None and now[1] > 1 and now[0] != 0:
            warnings.warn(
                f"fp8 measurements of rank {now[0]} of {now[1]} are written to the same file as rank 0's: the model was"
                " converted before this worker knew its rank (as with Intel Neural Compressor, the rank is fixed at"
                " conversion). Measure on one card, or launch the measurement as a script so each process converts"
                " its own model.", stacklevel=2)
        try:
            target = measurement_file(state.config, state.rank_world)
            state.written = engine.finish_measurement(model, state.config, target)
        except Fp8EngineError as err:
            raise Fp8InferenceError(str(err)) from None
        written.append(state.written)
    return written


def pending_measurements() -> list[torch.nn.Module]:
    """Models set up to measure whose measurements have not been written yet."""
    return [model for model, state in _states.items() if state.mode == "measure" and state.written is None]

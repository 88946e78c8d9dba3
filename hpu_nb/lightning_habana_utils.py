"""lightning-habana's helper functions, flags and package data, as hpu_nb's own: what `lightning_habana.utils.*`,
`lightning_habana.pytorch.plugins.precision`, `...strategies.deepspeed` and `...plugins.quant_config.fp8` serve
(hpu_nb/lightning_habana_names.py) where the archived plugin is not installed.

The plugin's tests, examples and docs import these (`get_device_name_from_hlsmi() == "GAUDI"` to skip fp8 tests,
`_LIGHTNING_GREATER_EQUAL_2_3_0` in its language-model example, `supported_reduce_ops` in a test's expected message,
the `quant_config.fp8` JSON files as a default fp8 config). Each behaves as the plugin's did (lightning_habana/utils/
resources.py, imports.py, hpu_distributed.py at its last release), answered by hpu_nb's runtime instead of by running
`hl-smi` again; where hpu_nb can do more, the answer says what hpu_nb does (`supported_reduce_ops` has product: HCCL
reduces with it, and hpu_nb's strategies accept it).

Module-level flags are computed on first use (the served modules look names up lazily), never at `import hpu_nb`.
"""

from __future__ import annotations

import functools
import json
import operator
import re
from pathlib import Path
from typing import Any, Literal

__all__ = [  # and, looked up on first use (module __getattr__), the plugin's names in _FLAGS
    "FP8_CONFIG_FILES",
    "flag",
    "get_device_name_from_backend",
    "get_device_name_from_hlsmi",
    "get_device_stats",
    "get_hpu_synapse_version",
    "modify_fp8_json",
    "quant_config_dir",
]

MAXABS_MEASURE_NAME = "maxabs_measure.json"
MAXABS_QUANT_NAME = "maxabs_quant.json"


# -- utils.resources ---------------------------------------------------------------------------------------------------
def _parse_hpus(devices: Any) -> int | None:
    """lightning-habana's `_parse_hpus`: None stays None, a digit string becomes an int; other types are refused."""
    from lightning.fabric.utilities.exceptions import MisconfigurationException  # noqa: PLC0415 -- lazy: Lightning

    if devices is not None and not isinstance(devices, (int, str)):
        raise MisconfigurationException("`devices` for `HPUAccelerator` must be int, string or None.")
    return int(devices) if isinstance(devices, str) else devices


def _parse_hpu_synapse_versions(line: str) -> tuple[str, str]:
    """`hl-smi -v`'s line -> (SynapseAI version, firmware version), ("", "") with a warning when it names neither
    (the plugin's contract; the parsing is the runtime's)."""
    from hpu_nb.runtime import hlsmi  # noqa: PLC0415 -- lazy

    version = hlsmi.parse_version(line)
    if version is None or version.firmware is None:
        _warn("Provided string does not include Habana version; check if HPU is available with `hl-smi`.")
        return "", ""
    return version.synapseai, version.firmware


def _parse_for_device_name(line: str) -> str:
    """`hl-smi -L`'s text -> "GAUDI2" / "GAUDI3" (from its `hl-gaudi<N>` firmware tag), "GAUDI" with a warning when
    none is named (the plugin's contract)."""
    match = re.search(r"hl-gaudi(\d*)", line or "")
    if match is None:
        _warn("Provided string does not include device name; check if HPU is available with `hl-smi -L`.")
        return "GAUDI"
    return "GAUDI" + match.group(1)


@functools.cache
def get_hpu_synapse_version() -> str:
    """The Gaudi software release, "1.21.0" style: what `hl-smi -v` says on a Gaudi (else the installed
    habana-torch-plugin's), the emulated release on the emulated Gaudi; "0.0.0" when it cannot be told (the plugin's
    answer without hl-smi)."""
    from hpu_nb.runtime import get_backend  # noqa: PLC0415 -- lazy

    backend = get_backend()
    synapseai = backend.versions().synapseai
    if synapseai:
        return str(synapseai)
    release = backend.release()
    return f"{release.major}.{release.minor}.0" if release is not None else "0.0.0"


@functools.cache
def get_device_name_from_backend() -> str:
    """The generation's name, "GAUDI" / "GAUDI2" / "GAUDI3", as Habana's get_device_name() gives it (no "(emulated)"
    mark: code compares it with those strings); read without acquiring a card."""
    from hpu_nb.runtime import get_backend  # noqa: PLC0415 -- lazy

    return str(get_backend().device_name())


@functools.cache
def get_device_name_from_hlsmi() -> str:
    """The plugin asked `hl-smi -L` (falling back to the backend); hpu_nb's runtime has read it already: the same
    answer as get_device_name_from_backend."""
    return get_device_name_from_backend()


def get_device_stats(device: Any) -> dict[str, Any]:
    """The card's memory counters (Limit, InUse, MaxInUse, ...), as HPUAccelerator.get_device_stats."""
    from hpu_nb.core.accelerator import HPUAccelerator  # noqa: PLC0415 -- lazy: Lightning

    return HPUAccelerator().get_device_stats(device)


def modify_fp8_json(file_path: str, patch: dict[str, Any]) -> None:
    """Set the `patch` entries in the JSON object stored at `file_path`, in place (what the plugin wrote the fp8
    measurement path into its configs with; hpu_nb's fp8 inference does the same, hpu_nb.core.fp8.inference)."""
    from hpu_nb.core.fp8.inference import patch_json_file  # noqa: PLC0415 -- lazy: Lightning

    patch_json_file(Path(file_path), patch)


def _warn(message: str) -> None:
    from lightning.fabric.utilities.rank_zero import rank_zero_warn  # noqa: PLC0415 -- lazy: Lightning

    rank_zero_warn(message)


# -- utils.hpu_distributed ---------------------------------------------------------------------------------------------
def _supported_reduce_ops() -> dict[str, Any]:
    from hpu_nb.core.strategy_parts.collectives import SUPPORTED_REDUCE_OPS  # noqa: PLC0415 -- lazy: Lightning

    return dict(SUPPORTED_REDUCE_OPS)


# -- the plugin's flags (utils.imports, utils.resources, plugins.precision, strategies.deepspeed) ----------------------
def _compare(package: str, op: Any, version: str, use_base_version: bool = False) -> bool:
    from lightning_utilities.core.imports import compare_version  # noqa: PLC0415 -- lazy

    return bool(compare_version(package, op, version, use_base_version))


def _synapse_at_least(version: str) -> bool:
    from packaging.version import Version  # noqa: PLC0415 -- lazy

    return Version(get_hpu_synapse_version()) >= Version(version)


def _torch_base_below(version: str) -> bool:
    import torch  # noqa: PLC0415 -- lazy
    from packaging.version import Version  # noqa: PLC0415 -- lazy

    return Version(Version(torch.__version__).base_version) < Version(version)


def _habana_frameworks_available() -> bool:
    """Habana's software, or the emulated one hpu_nb provides in its place: `import habana_frameworks` works."""
    import importlib.util  # noqa: PLC0415

    return importlib.util.find_spec("habana_frameworks") is not None


def _fp8_inference_engine_available() -> bool:
    """The plugin's `_INTEL_NEURAL_COMPRESSOR_AVAILABLE` gated fp8 inference: True where hpu_nb can measure and
    quantize (Intel Neural Compressor on a Gaudi; the emulated engine otherwise)."""
    from hpu_nb.runtime import get_backend  # noqa: PLC0415 -- lazy

    return bool(get_backend().fp8_engine().inference_support()[0])


def _deepspeed_available() -> Any:
    """The plugin asked for Habana's DeepSpeed fork; hpu_nb's HPUDeepSpeedStrategy runs on DeepSpeed's releases (its
    `deepspeed` extra): a RequirementCache of that range (truthy when installed, str() says why not)."""
    from lightning_utilities.core.imports import RequirementCache  # noqa: PLC0415 -- lazy

    return RequirementCache("deepspeed>=0.16")


def _precision_input() -> Any:
    """The precision names lightning-habana's HPUPrecisionPlugin took, as its `_PRECISION_INPUT` Literal (its tests
    parametrize over get_args() of it); hpu_nb's plugin takes these and more (hpu_nb.core.precision_names)."""
    from hpu_nb.core.precision_names import LIGHTNING_HABANA_PRECISIONS  # noqa: PLC0415 -- lazy: Lightning

    return Literal[LIGHTNING_HABANA_PRECISIONS]  # a tuple subscript is the Literal of its items


def _kineto_available() -> bool:
    import torch  # noqa: PLC0415 -- lazy

    return bool(torch.profiler.kineto_available())


def _torchvision_available() -> Any:
    from lightning_utilities.core.imports import RequirementCache  # noqa: PLC0415 -- lazy

    return RequirementCache("torchvision")


_FLAGS: dict[str, Any] = {
    "_HABANA_FRAMEWORK_AVAILABLE": _habana_frameworks_available,
    "_INTEL_NEURAL_COMPRESSOR_AVAILABLE": _fp8_inference_engine_available,
    "_HPU_SYNAPSE_GREATER_EQUAL_1_17_0": lambda: _synapse_at_least("1.17.0"),
    "_TORCH_LESSER_EQUAL_1_13_1": lambda: _compare("torch", operator.le, "1.13.1"),
    "_TORCH_GREATER_EQUAL_2_0_0": lambda: _compare("torch", operator.ge, "2.0.0"),
    "_TORCH_LESSER_2_3_0": lambda: _torch_base_below("2.3.0"),
    "_LIGHTNING_GREATER_EQUAL_2_0_0": lambda: (_compare("lightning", operator.ge, "2.0.0")
                                               or _compare("pytorch_lightning", operator.ge, "2.0.0")),
    "_LIGHTNING_GREATER_EQUAL_2_3_0": lambda: (_compare("lightning", operator.ge, "2.3.0", True)
                                               or _compare("pytorch_lightning", operator.ge, "2.3.0", True)),
    "_TORCHVISION_AVAILABLE": _torchvision_available,
    "_KINETO_AVAILABLE": _kineto_available,
    "_HPU_DEEPSPEED_AVAILABLE": _deepspeed_available,
    "supported_reduce_ops": _supported_reduce_ops,
    "_PRECISION_INPUT": lambda: _precision_input(),
    "MAXABS_MEASURE": lambda: str(quant_config_dir() / MAXABS_MEASURE_NAME),
    "MAXABS_QUANT": lambda: str(quant_config_dir() / MAXABS_QUANT_NAME),
}


def flag(name: str) -> Any:
    """The value of one of the plugin's module-level names above, computed once."""
    if name not in _values:
        _values[name] = _FLAGS[name]()
    return _values[name]


_values: dict[str, Any] = {}


def __getattr__(name: str) -> Any:  # the served modules look the names up as attributes of this module
    if name in _FLAGS:
        return flag(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- plugins.quant_config.fp8: the default fp8 inference configs ------------------------------------------------------
def _default_configs(dump_stats_path: str) -> dict[str, dict[str, Any]]:
    """hpu_nb's default measure / quantize configs (Intel Neural Compressor's fp8 keys, as the plugin shipped them:
    max-abs observation; quantizing with the hardware-aligned max-abs scale, the language-model head kept in high
    precision)."""
    from hpu_nb.core.fp8.inference import make_config  # noqa: PLC0415 -- lazy: Lightning

    return {
        MAXABS_MEASURE_NAME: make_config("MEASURE", dump_stats_path),
        MAXABS_QUANT_NAME: make_config("QUANTIZE", dump_stats_path, blocklist={"names": ["lm_head"]}),
    }


FP8_CONFIG_FILES = (MAXABS_MEASURE_NAME, MAXABS_QUANT_NAME)


def quant_config_dir() -> Path:
    """The folder served as the package `lightning_habana.pytorch.plugins.quant_config.fp8` (importlib.resources finds
    its two JSON files there): `<hpu_nb cache directory>/lightning_habana/quant_config/fp8`, each file written with
    hpu_nb's defaults where absent. A folder of the user's, not of the installed package: as with the plugin, fp8
    inference writes the measurement path into these files (modify_fp8_json), and an installed package is no place
    for that."""
    from hpu_nb.core.fp8.inference import default_data_dir, dump_stats_path  # noqa: PLC0415 -- lazy
    from hpu_nb.runtime import cache_dir  # noqa: PLC0415 -- lazy
    from hpu_nb.runtime.files import write_file_atomically  # noqa: PLC0415 -- lazy

    folder = Path(cache_dir()) / "lightning_habana" / "quant_config" / "fp8"
    folder.mkdir(parents=True, exist_ok=True)
    for name, document in _default_configs(str(dump_stats_path(default_data_dir()))).items():
        target = folder / name
        if not target.exists():
            write_file_atomically(target, json.dumps(document))  # processes starting together never read half a file
    return folder

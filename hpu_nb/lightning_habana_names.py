"""`import lightning_habana` where the archived plugin is not installed: its module paths, served by hpu_nb's classes.

lightning-habana's users (and the seed documents) write `from lightning_habana.pytorch.accelerator import
HPUAccelerator`, `from lightning_habana.pytorch.strategies import HPUDeepSpeedStrategy`, ... . The plugin is archived;
hpu_nb has the same pieces under its own names. This module is the one table from each of the plugin's public module
paths to the names it exports, and the loader that makes those paths importable: each is a small module whose names
are hpu_nb's own objects (`lightning_habana.pytorch.accelerator.HPUAccelerator is hpu_nb.HPUAccelerator`), looked up
on first use, so `import lightning_habana` imports no Lightning.

It is found by the start-up finder of `hpu_nb-habana.pth` (_hpu_nb_habana_finder.py), which is last on sys.meta_path:
a real `lightning_habana` anywhere on sys.path always wins, and HPU_NB_AUTOLOAD=0 turns it off.

Flavour: as lightning-habana chose (`module_available("lightning")` first, else `pytorch_lightning`), the Trainer
pieces are `hpu_nb`'s (for `lightning.pytorch`) where the `lightning` package is installed, else those of
`hpu_nb.pytorch_lightning`; the Fabric pieces are `hpu_nb.fabric`'s, else `hpu_nb.lightning_fabric`'s. A piece of one
flavour given to the other package's Trainer or Fabric is an error that names the import to use (core/registration).

Also served, from hpu_nb/lightning_habana_utils.py: the plugin's helpers and flags that its tests, examples and docs
import (`utils.resources.get_device_name_from_hlsmi`, `utils.imports._LIGHTNING_GREATER_EQUAL_2_3_0`,
`utils.hpu_distributed.supported_reduce_ops`, `plugins.precision._PRECISION_INPUT`, ...), and the package data
`pytorch.plugins.quant_config.fp8` (its maxabs_measure.json / maxabs_quant.json, hpu_nb's defaults in a folder of the
cache directory, found by importlib.resources).

Not served: the plugin's other private helpers, its MediaPipe data loaders (`pytorch.datamodule.dataloaders`,
`pytorch.datamodule.utils`: Habana's media engine, which hpu_nb's HPUDataModule uses where there is one) and
`__version__` (hpu_nb is not lightning-habana 1.x). Patching a served flag (`patch("lightning_habana.pytorch.plugins.
precision._INTEL_NEURAL_COMPRESSOR_AVAILABLE", False)`) changes the served name only, not what hpu_nb's plugin does.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Sequence
from typing import Any

PACKAGE = "lightning_habana"
MARK = "__hpu_nb_names__"  # set on every module served here (the start-up finder serves submodules only under it)

# The pieces' homes, per side and flavour ("lightning": the `lightning` package; "standalone": pytorch_lightning /
# lightning_fabric).
SOURCES = {
    "trainer": {"lightning": "hpu_nb", "standalone": "hpu_nb.pytorch_lightning"},
    "fabric": {"lightning": "hpu_nb.fabric", "standalone": "hpu_nb.lightning_fabric"},
    # the plugin's helper functions, flags and package data (no flavour: hpu_nb/lightning_habana_utils.py)
    "utils": {"lightning": "hpu_nb.lightning_habana_utils", "standalone": "hpu_nb.lightning_habana_utils"},
}

_TRAINER_ALL = (
    "HPUAccelerator", "HPUDDPStrategy", "HPUDeepSpeedStrategy", "HPUParallelStrategy", "SingleHPUStrategy",
    "HPUFSDPStrategy", "HPUPrecisionPlugin", "HPUCheckpointIO", "HPUProfiler", "HPUDataModule",
    "HPUDeepSpeedPrecisionPlugin", "HPUFSDPPrecision",
)
_FABRIC_ALL = (
    "HPUAccelerator", "HPUDDPStrategy", "HPUParallelStrategy", "SingleHPUStrategy", "HPUPrecision", "HPUCheckpointIO",
    "HPUFSDPStrategy", "HPUFSDPPrecision",
)

# The plugin's helpers and flags (lightning_habana/utils/resources.py, imports.py, hpu_distributed.py), served from
# hpu_nb.lightning_habana_utils ("utils:" below); the plugin's modules re-exported some of them, and its tests import or
# patch them where they were re-exported.
_RESOURCES = tuple(f"{name}=utils:{name}" for name in (
    "_HABANA_FRAMEWORK_AVAILABLE", "_INTEL_NEURAL_COMPRESSOR_AVAILABLE", "_parse_hpus", "_parse_hpu_synapse_versions",
    "get_hpu_synapse_version", "get_device_name_from_backend", "_parse_for_device_name", "get_device_name_from_hlsmi",
    "get_device_stats", "modify_fp8_json"))
_IMPORTS = tuple(f"{name}=utils:{name}" for name in (
    "_HABANA_FRAMEWORK_AVAILABLE", "get_hpu_synapse_version", "_HPU_SYNAPSE_GREATER_EQUAL_1_17_0",
    "_TORCH_LESSER_EQUAL_1_13_1", "_TORCH_GREATER_EQUAL_2_0_0", "_TORCH_LESSER_2_3_0", "_LIGHTNING_GREATER_EQUAL_2_0_0",
    "_LIGHTNING_GREATER_EQUAL_2_3_0", "_TORCHVISION_AVAILABLE", "_KINETO_AVAILABLE"))
_PRECISION_EXTRAS = tuple(f"{name}=utils:{name}" for name in (
    "_PRECISION_INPUT", "_HABANA_FRAMEWORK_AVAILABLE", "_INTEL_NEURAL_COMPRESSOR_AVAILABLE",
    "_HPU_SYNAPSE_GREATER_EQUAL_1_17_0", "modify_fp8_json", "MAXABS_MEASURE", "MAXABS_QUANT"))
_AVAILABILITY = ("is_fp8_available=HPUAccelerator.is_fp8_available",
                 "is_fp16_available=HPUAccelerator.is_fp16_available")
# the package whose data are the default fp8 inference configs (maxabs_measure.json, maxabs_quant.json)
QUANT_CONFIG_PACKAGE = f"{PACKAGE}.pytorch.plugins.quant_config.fp8"

# module path -> (side, names it exports). A name maps to the same name in the side's module unless written
# "name=path": `path` is an attribute path there ("other_side:path" in another side's module); a trailing "()" calls it
# (once, when the name is first asked for).
MODULES: dict[str, tuple[str, tuple[str, ...]]] = {
    PACKAGE: ("trainer", (*_TRAINER_ALL, "HPU_AVAILABLE=HPUAccelerator.is_available()")),
    f"{PACKAGE}.pytorch": ("trainer", _TRAINER_ALL),
    f"{PACKAGE}.pytorch.accelerator": ("trainer", ("HPUAccelerator",)),
    f"{PACKAGE}.pytorch.strategies": ("trainer", (
        "HPUFSDPStrategy", "HPUDDPStrategy", "HPUDeepSpeedStrategy", "HPUParallelStrategy", "SingleHPUStrategy")),
    f"{PACKAGE}.pytorch.strategies.ddp": ("trainer", ("HPUDDPStrategy",)),
    f"{PACKAGE}.pytorch.strategies.deepspeed": ("trainer", (
        "HPUDeepSpeedStrategy", "_HPU_DEEPSPEED_AVAILABLE=utils:_HPU_DEEPSPEED_AVAILABLE",
        "_HPU_SYNAPSE_GREATER_EQUAL_1_17_0=utils:_HPU_SYNAPSE_GREATER_EQUAL_1_17_0")),
    f"{PACKAGE}.pytorch.strategies.fsdp": ("trainer", ("HPUFSDPStrategy",)),
    f"{PACKAGE}.pytorch.strategies.parallel": ("trainer", ("HPUParallelStrategy",)),
    f"{PACKAGE}.pytorch.strategies.single": ("trainer", ("SingleHPUStrategy",)),
    f"{PACKAGE}.pytorch.plugins": ("trainer", (
        "HPUPrecisionPlugin", "HPUCheckpointIO", "HPUDeepSpeedPrecisionPlugin", "HPUFSDPPrecision")),
    f"{PACKAGE}.pytorch.plugins.precision": ("trainer", ("HPUPrecisionPlugin", *_AVAILABILITY, *_PRECISION_EXTRAS)),
    f"{PACKAGE}.pytorch.plugins.deepspeed_precision": ("trainer", (
        "HPUDeepSpeedPrecisionPlugin", "HPUPrecisionPlugin", "_PRECISION_INPUT=utils:_PRECISION_INPUT")),
    f"{PACKAGE}.pytorch.plugins.fsdp_precision": ("trainer", (
        "HPUFSDPPrecision", "HPUPrecisionPlugin", "_PRECISION_INPUT=utils:_PRECISION_INPUT")),
    f"{PACKAGE}.pytorch.plugins.quant_config": ("utils", ()),
    QUANT_CONFIG_PACKAGE: ("utils", ()),
    f"{PACKAGE}.pytorch.plugins.io_plugin": ("trainer", ("HPUCheckpointIO",)),
    f"{PACKAGE}.pytorch.profiler": ("trainer", ("HPUProfiler",)),
    f"{PACKAGE}.pytorch.profiler.profiler": ("trainer", ("HPUProfiler",)),
    f"{PACKAGE}.pytorch.datamodule": ("trainer", ("HPUDataModule",)),
    f"{PACKAGE}.pytorch.datamodule.datamodule": ("trainer", ("HPUDataModule",)),
    f"{PACKAGE}.fabric": ("fabric", _FABRIC_ALL),
    f"{PACKAGE}.fabric.accelerator": ("fabric", ("HPUAccelerator",)),
    f"{PACKAGE}.fabric.strategies": ("fabric", (
        "HPUFSDPStrategy", "HPUDDPStrategy", "HPUParallelStrategy", "SingleHPUStrategy")),
    f"{PACKAGE}.fabric.strategies.ddp": ("fabric", ("HPUDDPStrategy",)),
    f"{PACKAGE}.fabric.strategies.fsdp": ("fabric", ("HPUFSDPStrategy",)),
    f"{PACKAGE}.fabric.strategies.parallel": ("fabric", ("HPUParallelStrategy",)),
    f"{PACKAGE}.fabric.strategies.single": ("fabric", ("SingleHPUStrategy",)),
    # the plugin's __all__ here lists HPUCheckpointIO without importing it (an AttributeError there); served here
    f"{PACKAGE}.fabric.plugins": ("fabric", ("HPUFSDPPrecision", "HPUPrecision", "HPUCheckpointIO")),
    f"{PACKAGE}.fabric.plugins.precision": ("fabric", ("HPUPrecision",)),
    f"{PACKAGE}.fabric.plugins.fsdp_precision": ("fabric", ("HPUFSDPPrecision",)),
    f"{PACKAGE}.fabric.plugins.io_plugin": ("fabric", ("HPUCheckpointIO",)),
    f"{PACKAGE}.utils": ("trainer", ()),
    f"{PACKAGE}.utils.resources": ("trainer", (
        "device_count=HPUAccelerator.auto_device_count", *_AVAILABILITY, *_RESOURCES)),
    f"{PACKAGE}.utils.imports": ("utils", _IMPORTS),
    f"{PACKAGE}.utils.hpu_distributed": ("utils", ("supported_reduce_ops",)),
}

_flavour: str | None = None


def flavour() -> str:
    """"lightning" where the `lightning` package is installed, else "standalone" (lightning-habana's own order)."""
    global _flavour
    if _flavour is None:
        try:  # as lightning_utilities.module_available asks
            found = importlib.util.find_spec("lightning") is not None
        except (ImportError, ValueError):
            found = False
        _flavour = "lightning" if found else "standalone"
    return _flavour


def exported_names(module: str) -> list[str]:
    """The names `module` (a key of MODULES) exports, as its `__all__`."""
    return [entry.partition("=")[0] for entry in MODULES[module][1]]


def resolve(module: str, name: str) -> Any:
    """The hpu_nb object that `module`'s `name` is, for this process's flavour."""
    side, entries = MODULES[module]
    entry = next((e for e in entries if e.partition("=")[0] == name), None)
    if entry is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    path = entry.partition("=")[2] or name
    if ":" in path:
        side, path = path.split(":", 1)
    call = path.endswith("()")
    value: Any = importlib.import_module(SOURCES[side][flavour()])
    for part in path.removesuffix("()").split("."):
        value = getattr(value, part)
    return value() if call else value


def _is_package(module: str) -> bool:
    return module == QUANT_CONFIG_PACKAGE or any(key.startswith(f"{module}.") for key in MODULES)


class _FolderReader:  # importlib.resources' TraversableResources, duck-typed: a package's data in one folder
    def __init__(self, folder: Any) -> None:
        self.folder = folder

    def files(self) -> Any:
        return self.folder


class _NamesLoader:  # a Loader, duck-typed (importlib.abc costs milliseconds)
    def create_module(self, spec: Any) -> None:
        return None

    def get_resource_reader(self, fullname: str) -> _FolderReader | None:
        """The quant_config.fp8 package's data (importlib.resources.files / path ask for it)."""
        if fullname != QUANT_CONFIG_PACKAGE:
            return None
        from hpu_nb.lightning_habana_utils import quant_config_dir  # noqa: PLC0415 -- lazy, as every served name

        return _FolderReader(quant_config_dir())

    def exec_module(self, module: types.ModuleType) -> None:
        fullname = module.__name__
        names = exported_names(fullname)

        def __getattr__(name: str) -> Any:  # PEP 562: a module's __getattr__
            if name in names:
                value = resolve(fullname, name)
                setattr(module, name, value)
                return value
            if f"{fullname}.{name}" in MODULES:  # `lightning_habana.pytorch.accelerator` without importing it first
                return importlib.import_module(f"{fullname}.{name}")
            raise AttributeError(f"module {fullname!r} has no attribute {name!r}")

        def __dir__() -> list[str]:
            children = {key[len(fullname) + 1:].split(".")[0] for key in MODULES if key.startswith(f"{fullname}.")}
            return sorted(set(vars(module)) | set(names) | children)

        module.__doc__ = (f"{fullname}, served by hpu_nb (lightning-habana is not installed): hpu_nb's classes under"
                          " the plugin's names (hpu_nb/lightning_habana_names.py).")
        vars(module).update(__all__=list(names), __getattr__=__getattr__, __dir__=__dir__, **{MARK: True})


_LOADER = _NamesLoader()


def find_spec(fullname: str, path: Sequence[str] | None = None, target: Any = None) -> Any:
    """The spec of one of lightning_habana's module paths (None for any other name), served by hpu_nb."""
    if fullname not in MODULES:
        return None
    if fullname != PACKAGE and not getattr(sys.modules.get(PACKAGE), MARK, False):
        return None  # a real lightning_habana is imported: its own submodules, or none
    return importlib.machinery.ModuleSpec(fullname, _LOADER, is_package=_is_package(fullname))

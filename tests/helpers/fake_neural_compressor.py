"""A fake Intel Neural Compressor (`neural_compressor.torch.quantization`) recording what hpu_nb asks of it.

Not in the shared fake habana_frameworks because INC is a separate package; install with `install_fake_inc()`.
Modelled on INC's fp8_quant (quant_config.py, prepare_model.py, save_measure): FP8Config fills in INC's defaults
(mode QUANTIZE, observer maxabs, scale_method maxabs_hw), fixes the rank suffix of the measurement file when the
config is parsed (torch.distributed rank, else LOCAL_RANK; world from torch.distributed or WORLD_SIZE),
`finalize_calibration` writes `<dump_stats_path>_hooks_<observer>[_<rank>_<world>].json`, and `convert` fails when that
file does not exist. It records where each model was (its device) when finalize_calibration ran.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import json
import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

NAMES = ("neural_compressor", "neural_compressor.torch", "neural_compressor.torch.quantization")
DEFAULTS = {"mode": "QUANTIZE", "observer": "maxabs", "scale_method": "maxabs_hw", "dump_stats_path": "stats",
            "allowlist": {"types": [], "names": []}, "blocklist": {"types": [], "names": []}}


class FakeINC:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.devices_at_finalize: list[str] = []

    def named(self, name: str) -> list[Any]:
        return [arg for call, arg in self.calls if call == name]


def _rank_suffix() -> str:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return f"_{dist.get_rank()}_{dist.get_world_size()}"
    if os.environ.get("LOCAL_RANK") is not None:
        return f"_{os.environ['LOCAL_RANK']}_{os.environ.get('WORLD_SIZE', -1)}"
    return ""


@contextlib.contextmanager
def install_fake_inc() -> Iterator[FakeINC]:
    fake = FakeINC()
    saved = {name: sys.modules.get(name) for name in NAMES}

    class FP8Config:
        def __init__(self, **fields: Any) -> None:
            self.fields = fields
            merged = {**DEFAULTS, **fields}
            self.measure = str(merged["mode"]).upper() == "MEASURE"
            self.measure_file = Path(f"{merged['dump_stats_path']}_hooks_{merged['observer']}{_rank_suffix()}.json")

        @classmethod
        def from_dict(cls, d: dict) -> FP8Config:
            fake.calls.append(("FP8Config.from_dict", dict(d)))
            return cls(**d)

        @classmethod
        def from_json_file(cls, path: str) -> FP8Config:
            with open(path, encoding="utf-8") as f:
                return cls.from_dict(json.load(f))

    def prepare(model: Any, config: FP8Config) -> Any:
        fake.calls.append(("prepare", config.fields))
        model._fake_inc_config = config
        return model

    def convert(model: Any, config: FP8Config) -> Any:
        fake.calls.append(("convert", config.fields))
        if not config.measure_file.is_file():
            raise FileNotFoundError(f"[Errno 2] No such file or directory: '{config.measure_file}'")
        return model

    def finalize_calibration(model: Any) -> None:
        fake.calls.append(("finalize_calibration", model))
        fake.devices_at_finalize.append(str(next(model.parameters()).device))
        config = model._fake_inc_config
        config.measure_file.parent.mkdir(parents=True, exist_ok=True)
        nodes = {name: {"inputs": [1.0], "outputs": [1.0], "params": {"weight": 1.0}}
                 for name, m in model.named_modules() if type(m).__name__ == "Linear"}
        config.measure_file.write_text(json.dumps({"GlobalRank": None, "LocalRank": None, "Mode": "DynamicRange",
                                                   "Nodes": nodes}))

    modules = {name: types.ModuleType(name) for name in NAMES}
    for name, module in modules.items():
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        module.__path__ = []  # type: ignore[attr-defined]
    q = modules["neural_compressor.torch.quantization"]
    q.FP8Config, q.prepare, q.convert, q.finalize_calibration = FP8Config, prepare, convert, finalize_calibration
    modules["neural_compressor"].torch = modules["neural_compressor.torch"]  # type: ignore[attr-defined]
    modules["neural_compressor.torch"].quantization = q  # type: ignore[attr-defined]
    sys.modules.update(modules)
    try:
        yield fake
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module

"""A fake Intel Neural Compressor (`neural_compressor.torch.quantization`) recording what hpu_nb asks of it.

Not in the shared fake habana_frameworks because INC is a separate package; install with `install_fake_inc()`.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import sys
import types
from typing import Any, Iterator

NAMES = ("neural_compressor", "neural_compressor.torch", "neural_compressor.torch.quantization")


class FakeINC:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def named(self, name: str) -> list[Any]:
        return [arg for call, arg in self.calls if call == name]


@contextlib.contextmanager
def install_fake_inc() -> Iterator[FakeINC]:
    fake = FakeINC()
    saved = {name: sys.modules.get(name) for name in NAMES}

    class FP8Config:
        def __init__(self, **fields: Any) -> None:
            self.fields = fields

        @classmethod
        def from_dict(cls, d: dict) -> "FP8Config":
            fake.calls.append(("FP8Config.from_dict", dict(d)))
            return cls(**d)

        @classmethod
        def from_json_file(cls, path: str) -> "FP8Config":
            import json

            with open(path, encoding="utf-8") as f:
                return cls.from_dict(json.load(f))

    def prepare(model: Any, config: FP8Config) -> Any:
        fake.calls.append(("prepare", config.fields))
        return model

    def convert(model: Any, config: FP8Config) -> Any:
        fake.calls.append(("convert", config.fields))
        return model

    def finalize_calibration(model: Any) -> None:
        fake.calls.append(("finalize_calibration", model))

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

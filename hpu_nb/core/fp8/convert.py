"""convert_modules: make a model fp8-ready for training (swap nn.Linear) or for inference (measure / quantize).

Module-level so every precision plugin (HPUPrecisionPlugin, the DeepSpeed one) shares one implementation. The fp8
layers and autocast are the device's fp8 engine's (`get_backend().fp8_engine()`): te.Linear and te.fp8_autocast of the
transformer engine, Habana's on a Gaudi, the emulated one elsewhere.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from hpu_nb.core.fp8.inference import prepare_inference
from hpu_nb.core.precision_names import UnsupportedPrecisionError
from hpu_nb.runtime import get_backend
from hpu_nb.runtime.fp8.transformer_engine import te_recipe


def require_fp8() -> None:
    """Raise the clear error when this Gaudi generation (real or emulated) has no fp8."""
    ok, reason = get_backend().fp8_support()
    if not ok:
        raise UnsupportedPrecisionError(f"fp8 cannot run here: {reason}")


def has_fp8_layers(module: torch.nn.Module) -> bool:
    """Whether `module` already holds fp8 layers (converted before, or built with them by its author)."""
    engine = get_backend().fp8_engine()
    return any(engine.is_fp8_layer(m) for m in module.modules())


def replace_linear_layers(module: torch.nn.Module, recipe: Any = None) -> int:
    """Swap every nn.Linear below `module` for the engine's fp8 layer, keeping its weights. Returns the count."""
    engine = get_backend().fp8_engine()
    if has_fp8_layers(module):
        rank_zero_info("The model already holds fp8 layers; leaving its layers as they are.")
        return 0
    return _swap(module, lambda linear: engine.fp8_layer(linear, recipe))


def _swap(module: torch.nn.Module, make: Any) -> int:
    count = 0
    for name, child in list(module.named_children()):
        if type(child) is torch.nn.Linear:
            setattr(module, name, make(child))
            count += 1
        else:
            count += _swap(child, make)
    return count


def convert_modules(
    module: torch.nn.Module,
    replace_layers: bool = False,
    recipe: Any = None,
    inference: bool = False,
    quant: bool | str | dict[str, Any] = True,
    fp8_data_path: str | None = None,
) -> torch.nn.Module:
    """fp8 training (replace_layers=True) or inference (inference=True: quant=False measures, quant=True quantizes;
    a config file path or dict decides by its "mode").

    Returns the model to use (the same object, except where a Gaudi toolkit hands back a new one).
    """
    require_fp8()
    if inference:
        return prepare_inference(module, quant=quant, fp8_data_path=fp8_data_path)
    if replace_layers:
        count = replace_linear_layers(module, recipe)
        rank_zero_info(f"fp8: replaced {count} nn.Linear layer(s) with fp8 layers.")
    return module


@contextlib.contextmanager
def fp8_autocast(enabled: bool = True, recipe: Any = None) -> Iterator[None]:
    """fp8 for the converted layers inside the block (te.fp8_autocast on a Gaudi, the emulation otherwise)."""
    with get_backend().fp8_engine().autocast(enabled, recipe):
        yield


def to_te_recipe(recipe: Any) -> Any:
    """The transformer engine's te.recipe.DelayedScaling for ours / a dict; a te recipe passes through."""
    return te_recipe(recipe)

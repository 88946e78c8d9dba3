"""convert_modules: make a model fp8-ready for training (swap nn.Linear) or for inference (measure / quantize).

Module-level so every precision plugin (HPUPrecisionPlugin, the DeepSpeed one) shares one implementation.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from hpu_nb.core.fp8.inference import prepare_inference
from hpu_nb.core.fp8.linear import Fp8Linear, emulated_fp8_autocast
from hpu_nb.core.fp8.recipe import as_recipe
from hpu_nb.runtime import get_backend


def require_fp8() -> None:
    """Raise the clear error when this Gaudi generation (real or emulated) has no fp8."""
    from hpu_nb.core.accelerator import is_fp8_available
    from hpu_nb.core.precision import UnsupportedPrecisionError

    ok, reason = is_fp8_available()
    if not ok:
        raise UnsupportedPrecisionError(f"fp8 cannot run here: {reason}")


def _on_gaudi() -> bool:
    return not get_backend().is_emulated


def replace_linear_layers(module: torch.nn.Module, recipe: Any = None) -> int:
    """Swap every nn.Linear below `module` for the fp8 layer of this backend, keeping its weights. Returns the count."""
    if _on_gaudi():
        from hpu_nb.runtime import habana_fp8

        if any(habana_fp8.is_te_module(m) for m in module.modules()):
            rank_zero_info("The model already holds transformer-engine modules; leaving its layers as they are.")
            return 0
        make = habana_fp8.te_linear_from
    else:
        if any(isinstance(m, Fp8Linear) for m in module.modules()):
            rank_zero_info("The model already holds fp8 layers; leaving its layers as they are.")
            return 0
        recipe = as_recipe(recipe)

        def make(linear: torch.nn.Linear) -> torch.nn.Module:
            return Fp8Linear(linear, recipe)

    return _swap(module, make)


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
    quant: bool = True,
    fp8_data_path: Optional[str] = None,
) -> torch.nn.Module:
    """fp8 training (replace_layers=True) or inference (inference=True: quant=False measures, quant=True quantizes).

    Returns the model to use (the same object, except where a Gaudi toolkit hands back a new one).
    """
    require_fp8()
    if inference:
        return prepare_inference(module, quant=quant, fp8_data_path=fp8_data_path, gaudi=_on_gaudi())
    if replace_layers:
        count = replace_linear_layers(module, recipe)
        rank_zero_info(f"fp8: replaced {count} nn.Linear layer(s) with fp8 layers.")
    return module


@contextlib.contextmanager
def fp8_autocast(enabled: bool = True, recipe: Any = None) -> Iterator[None]:
    """fp8 for the converted layers inside the block: te.fp8_autocast on a Gaudi, the emulation otherwise."""
    if _on_gaudi():
        from hpu_nb.runtime import habana_fp8

        with habana_fp8.fp8_autocast(enabled=enabled, recipe=to_te_recipe(recipe)):
            yield
        return
    with emulated_fp8_autocast(enabled=enabled, recipe=recipe):
        yield


def to_te_recipe(recipe: Any) -> Any:
    """Habana's te.recipe.DelayedScaling for ours / a dict; a te recipe passes through."""
    from hpu_nb.runtime import habana_fp8

    if recipe is not None and type(recipe).__module__.startswith(habana_fp8.TE_MODULE):
        return recipe
    r = as_recipe(recipe)
    return habana_fp8.te_recipe(r.margin, r.interval, r.fp8_format.name, r.amax_history_len, r.amax_compute_algo)

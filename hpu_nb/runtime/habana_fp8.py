"""Habana's fp8 software, seen through one door: transformer_engine (training), INC or HQT (inference).

The only module importing `habana_frameworks...transformer_engine`, `neural_compressor` and
`habana_quantization_toolkit`. Everything is imported on first use, never at import of hpu_nb.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Any, Mapping, Optional

TE_MODULE = "habana_frameworks.torch.hpex.experimental.transformer_engine"
INC_MODULE = "neural_compressor.torch.quantization"
HQT_MODULE = "habana_quantization_toolkit"
HQT_LEGACY_MODULE = "quantization_toolkit.habana_quantization_toolkit"
CORE_MODULE = "habana_frameworks.torch.core"


def transformer_engine() -> Any:
    """Habana's transformer engine module (`te`), or a clear ImportError."""
    try:
        return importlib.import_module(TE_MODULE)
    except ImportError as err:
        raise ImportError(
            f"fp8 training on a Gaudi needs {TE_MODULE} (SynapseAI >= 1.14), which does not import: {err}"
        ) from err


def te_recipe(margin: int, interval: int, fp8_format: str, amax_history_len: int, amax_compute_algo: str) -> Any:
    """te.recipe.DelayedScaling with the same fields as hpu_nb's recipe."""
    recipe = transformer_engine().recipe
    return recipe.DelayedScaling(
        margin=margin,
        interval=interval,
        fp8_format=getattr(recipe.Format, fp8_format),
        amax_history_len=amax_history_len,
        amax_compute_algo=amax_compute_algo,
    )


def is_te_module(module: Any) -> bool:
    return TE_MODULE in type(module).__module__


def te_linear_from(linear: Any) -> Any:
    """A te.Linear holding a copy of `linear`'s weight and bias (not re-initialised)."""
    import torch

    te = transformer_engine()
    layer = te.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
    with torch.no_grad():
        layer.weight.copy_(linear.weight)
        if linear.bias is not None:
            layer.bias.copy_(linear.bias)
    return layer


def fp8_autocast(enabled: bool, recipe: Any) -> Any:
    return transformer_engine().fp8_autocast(enabled=enabled, fp8_recipe=recipe)


# -- inference ------------------------------------------------------------------------------------------------------
def inference_toolkit() -> str:
    """"inc" (Intel Neural Compressor), "hqt" (Habana Quantization Toolkit) or "" when neither is installed."""
    try:
        inc_installed = importlib.util.find_spec("neural_compressor") is not None
        if inc_installed and importlib.util.find_spec(INC_MODULE) is not None:
            return "inc"
    except (ImportError, ValueError):
        pass
    for name in (HQT_MODULE, "quantization_toolkit"):
        try:
            if importlib.util.find_spec(name) is not None:
                return "hqt"
        except (ImportError, ValueError):
            continue
    return ""


def _inc() -> Any:
    return importlib.import_module(INC_MODULE)


def inc_prepare(model: Any, config: Mapping[str, Any]) -> Any:
    """INC measure mode: FP8Config.from_dict(config) then prepare(model, cfg)."""
    inc = _inc()
    return inc.prepare(model, inc.FP8Config.from_dict(dict(config)))


def inc_convert(model: Any, config: Mapping[str, Any]) -> Any:
    """INC quantize mode: FP8Config.from_dict(config) then convert(model, cfg)."""
    inc = _inc()
    return inc.convert(model, inc.FP8Config.from_dict(dict(config)))


def inc_finalize(model: Any) -> None:
    _inc().finalize_calibration(model)


def _hqt() -> Any:
    try:
        return importlib.import_module(HQT_MODULE)
    except ImportError:
        return importlib.import_module(HQT_LEGACY_MODULE)


def hqt_prep_model(model: Any, config_path: str) -> Any:
    """HQT reads its JSON from QUANT_CONFIG; a user's own QUANT_CONFIG wins over ours."""
    os.environ.setdefault("QUANT_CONFIG", config_path)
    htcore = importlib.import_module(CORE_MODULE)
    htcore.hpu_set_env()
    _hqt().prep_model(model)
    htcore.hpu_initialize(model)
    return model


def hqt_finish(model: Optional[Any]) -> None:
    _hqt().finish_measurements(model)

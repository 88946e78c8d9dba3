"""Habana's fp8 software, seen through one door: the transformer engine (training) and Intel Neural Compressor
(inference), as the Gaudi's Fp8Engine.

The only module importing `habana_frameworks...transformer_engine` and `neural_compressor`. Everything is imported on
first use, never at import of hpu_nb. Modelled on lightning-habana's precision plugin and on Intel Neural Compressor's
fp8_quant: `htcore.hpu_set_env()` before INC's prepare / convert, `htcore.hpu_initialize(model,
mark_only_scales_as_const=True)` after, `finalize_calibration(model)` to write the measurements.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from pathlib import Path
from typing import Any, Iterator, Mapping

from hpu_nb.runtime.fp8 import Fp8Engine, Fp8EngineError
from hpu_nb.runtime.fp8.recipe import as_recipe

TE_MODULE = "habana_frameworks.torch.hpex.experimental.transformer_engine"
INC_MODULE = "neural_compressor.torch.quantization"
CORE_MODULE = "habana_frameworks.torch.core"
TE_LAYER_NAMES = ("Linear", "LayerNormLinear", "LayerNormMLP", "TransformerLayer", "DotProductAttention")


def transformer_engine() -> Any:
    """Habana's transformer engine module (`te`), or a clear ImportError."""
    try:
        return importlib.import_module(TE_MODULE)
    except ImportError as err:
        raise ImportError(
            f"fp8 training on a Gaudi needs {TE_MODULE} (Gaudi software 1.14 and newer; from 1.19 it needs"
            f" intel_transformer_engine too), which does not import: {err}"
        ) from err


def is_te_module(module: Any) -> bool:
    """Whether `module` is one of the transformer engine's layers. Tested with isinstance: from Gaudi software 1.19 the
    engine is a shim over `intel_transformer_engine`, so the classes' module names do not say habana_frameworks."""
    te = transformer_engine()
    layers = tuple(cls for cls in (getattr(te, name, None) for name in TE_LAYER_NAMES) if isinstance(cls, type))
    return bool(layers) and isinstance(module, layers)


def is_te_recipe(recipe: Any) -> bool:
    """Whether `recipe` is the transformer engine's own DelayedScaling (not hpu_nb's recipe, nor a dict)."""
    cls = getattr(getattr(transformer_engine(), "recipe", None), "DelayedScaling", None)
    return isinstance(cls, type) and isinstance(recipe, cls)


def te_recipe(recipe: Any) -> Any:
    """te.recipe.DelayedScaling for hpu_nb's recipe / a dict / None; a te recipe passes through."""
    if recipe is not None and is_te_recipe(recipe):
        return recipe
    r = as_recipe(recipe)
    module = transformer_engine().recipe
    return module.DelayedScaling(margin=r.margin, interval=r.interval,
                                 fp8_format=getattr(module.Format, r.fp8_format.name),
                                 amax_history_len=r.amax_history_len, amax_compute_algo=r.amax_compute_algo)


def inc_available() -> bool:
    try:
        return (importlib.util.find_spec("neural_compressor") is not None
                and importlib.util.find_spec(INC_MODULE) is not None)
    except (ImportError, ValueError):
        return False


def _inc() -> Any:
    if not inc_available():
        raise ImportError("fp8 inference on a Gaudi needs Intel Neural Compressor: pip install neural-compressor"
                          " (habana-quantization-toolkit is deprecated since lightning-habana 1.7).")
    return importlib.import_module(INC_MODULE)


class HabanaFp8Engine(Fp8Engine):
    """fp8 on a Gaudi: te.Linear / te.fp8_autocast for training, Intel Neural Compressor for inference."""

    name = "Habana transformer engine + Intel Neural Compressor"

    def inference_support(self) -> tuple[bool, str]:
        # lightning-habana's rule: Intel Neural Compressor installed (fp8 inference through it needs release 1.17+)
        if not inc_available():
            return False, "Intel Neural Compressor is not installed (pip install neural-compressor)"
        return True, ""

    # -- training
    def is_fp8_layer(self, module: Any) -> bool:
        return is_te_module(module)

    def fp8_layer(self, linear: Any, recipe: Any) -> Any:
        import torch

        layer = transformer_engine().Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
        with torch.no_grad():
            layer.weight.copy_(linear.weight)
            if linear.bias is not None:
                layer.bias.copy_(linear.bias)
        return layer

    @contextlib.contextmanager
    def autocast(self, enabled: bool, recipe: Any) -> Iterator[None]:
        with transformer_engine().fp8_autocast(enabled=enabled, fp8_recipe=te_recipe(recipe)):
            yield

    # -- inference
    def check_inference_config(self, config: Mapping[str, Any]) -> None:
        _inc()  # INC itself checks the settings when it parses the config

    def _around(self, model: Any, step: Any) -> Any:
        htcore = importlib.import_module(CORE_MODULE)
        htcore.hpu_set_env()
        model = step(model)
        htcore.hpu_initialize(model, mark_only_scales_as_const=True)
        return model

    def start_measurement(self, model: Any, config: Mapping[str, Any]) -> Any:
        inc = _inc()
        return self._around(model, lambda m: inc.prepare(m, inc.FP8Config.from_dict(dict(config))))

    def finish_measurement(self, model: Any, config: Mapping[str, Any], path: Path) -> Path:
        _inc().finalize_calibration(model)  # INC names the file as hpu_nb expects (measurement_file)
        return path

    def quantize(self, model: Any, config: Mapping[str, Any], measurements: Mapping[str, Any] | None) -> Any:
        inc = _inc()
        return self._around(model, lambda m: inc.convert(m, inc.FP8Config.from_dict(dict(config))))

    @property
    def reads_measurements_itself(self) -> bool:
        return True


__all__ = ["Fp8EngineError", "HabanaFp8Engine", "is_te_module", "is_te_recipe", "te_recipe", "transformer_engine"]

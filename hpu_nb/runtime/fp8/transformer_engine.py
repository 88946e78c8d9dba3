"""fp8 training through Habana's transformer engine: the one training path, on a Gaudi and on the emulated Gaudi.

Both backends train with `habana_frameworks.torch.hpex.experimental.transformer_engine` (`te`): on a Gaudi it is
Habana's (from 1.19 a shim over `intel_transformer_engine`), where Habana's software is absent it is the emulated
module (hpu_nb.emulator.habana). Layers are swapped for `te.Linear` and the forward runs in `te.fp8_autocast`, as
lightning-habana's precision plugin does; the engines differ only in inference (Intel Neural Compressor, or the
emulation's measure / quantize). The module is imported on first use, never at import of hpu_nb.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Iterator
from typing import Any

from hpu_nb.runtime.fp8.recipe import as_recipe

TE_MODULE = "habana_frameworks.torch.hpex.experimental.transformer_engine"
TE_LAYER_NAMES = ("Linear", "LayerNormLinear", "LayerNormMLP", "TransformerLayer", "DotProductAttention")


def transformer_engine() -> Any:
    """The transformer engine module (`te`) of the device's software, or a clear ImportError."""
    try:
        return importlib.import_module(TE_MODULE)
    except ImportError as err:
        raise ImportError(
            f"fp8 training needs {TE_MODULE} (on a Gaudi: software 1.14 and newer; from 1.19 it needs"
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


def _accepts(callable_: Any, name: str) -> bool:
    try:
        return name in inspect.signature(callable_).parameters
    except (TypeError, ValueError):
        return False


class TransformerEngineTraining:
    """The training half of an Fp8Engine: te.Linear layers and te.fp8_autocast."""

    def is_fp8_layer(self, module: Any) -> bool:
        return is_te_module(module)

    def fp8_layer(self, linear: Any, recipe: Any) -> Any:
        """A te.Linear holding `linear`'s own Parameters (the same objects, as optimum-habana's convert_model does:
        optimizers and DeepSpeed see the parameters they were given). The recipe is the fp8_autocast's, not the
        layer's."""
        te_linear = transformer_engine().Linear
        has_bias = linear.bias is not None
        kwargs: dict[str, Any] = {"bias": has_bias}
        if _accepts(te_linear, "skip_weight_param_allocation"):  # Gaudi software 1.19+: no throw-away allocation
            kwargs.update(params_dtype=linear.weight.dtype, skip_weight_param_allocation=True)
        layer = te_linear(linear.in_features, linear.out_features, **kwargs)
        layer.weight = linear.weight
        if has_bias:
            layer.bias = linear.bias
        return layer

    @contextlib.contextmanager
    def autocast(self, enabled: bool, recipe: Any) -> Iterator[None]:
        with transformer_engine().fp8_autocast(enabled=enabled, fp8_recipe=te_recipe(recipe)):
            yield


__all__ = ["TE_MODULE", "TransformerEngineTraining", "is_te_module", "is_te_recipe", "te_recipe", "transformer_engine"]

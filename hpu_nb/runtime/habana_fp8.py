"""Habana's fp8 software, seen through one door: the transformer engine (training) and Intel Neural Compressor
(inference), as the Gaudi's Fp8Engine.

Training goes through hpu_nb.runtime.fp8.transformer_engine (the same path the emulated Gaudi takes); this is the
only module importing `neural_compressor`. Everything is imported on first use, never at import of hpu_nb. Modelled
on lightning-habana's precision plugin and on Intel Neural Compressor's fp8_quant: `htcore.hpu_set_env()` before
INC's prepare / convert, `htcore.hpu_initialize(model, mark_only_scales_as_const=True)` after,
`finalize_calibration(model)` to write the measurements.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpu_nb.runtime.fp8 import Fp8Engine, Fp8EngineError
from hpu_nb.runtime.fp8.transformer_engine import (
    TE_MODULE,
    TransformerEngineTraining,
    is_te_module,
    is_te_recipe,
    te_recipe,
    transformer_engine,
)

INC_MODULE = "neural_compressor.torch.quantization"
CORE_MODULE = "habana_frameworks.torch.core"


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


class HabanaFp8Engine(TransformerEngineTraining, Fp8Engine):
    """fp8 on a Gaudi: te.Linear / te.fp8_autocast for training (TransformerEngineTraining, shared with the emulated
    Gaudi), Intel Neural Compressor for inference."""

    name = "Habana transformer engine + Intel Neural Compressor"

    def inference_support(self) -> tuple[bool, str]:
        # lightning-habana's rule: Intel Neural Compressor installed (fp8 inference through it needs release 1.17+)
        if not inc_available():
            return False, "Intel Neural Compressor is not installed (pip install neural-compressor)"
        return True, ""

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


__all__ = ["TE_MODULE", "Fp8EngineError", "HabanaFp8Engine", "is_te_module", "is_te_recipe", "te_recipe",
           "transformer_engine"]

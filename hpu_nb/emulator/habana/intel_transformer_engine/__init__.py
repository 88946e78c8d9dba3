"""intel_transformer_engine, emulated: the package Habana's transformer engine is a shim over (Gaudi software 1.19+).

Code that checks for fp8 support looks for it by name: accelerate (and so optimum-habana's `GaudiTrainingArguments(
fp8=True)`) asks `importlib.util.find_spec("intel_transformer_engine")` and the distribution `intel-transformer-engine`.
On the emulated Gaudi both exist where Habana's software is absent; the layers are the emulated transformer engine's
(habana_frameworks.torch.hpex.experimental.transformer_engine), the same classes under either name.
"""

from __future__ import annotations

import sys

from habana_frameworks.torch.hpex.experimental.transformer_engine import (
    Linear,
    distributed,
    fp8,
    fp8_autocast,
    recipe,
)

__emulated__ = True
__all__ = ["Linear", "distributed", "fp8", "fp8_autocast", "recipe"]

for _name in ("distributed", "fp8", "recipe"):  # `import intel_transformer_engine.recipe` finds the same modules
    sys.modules.setdefault(f"{__name__}.{_name}", getattr(sys.modules[__name__], _name))

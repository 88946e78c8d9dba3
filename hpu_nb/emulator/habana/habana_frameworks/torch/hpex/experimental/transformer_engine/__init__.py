"""habana_frameworks.torch.hpex.experimental.transformer_engine (`te`), emulated: fp8 training on the emulated Gaudi.

Habana's module (from Gaudi software 1.19 a shim over `intel_transformer_engine`) gives fp8 layers and the region
that turns fp8 on: `te.Linear`, `te.fp8_autocast(enabled, fp8_recipe=...)`, `te.recipe.DelayedScaling` / `Format`,
`te.fp8.FP8GlobalStateManager`, `te.distributed.activation_checkpointing`. This emulation models those names and
checks, computing with hpu_nb's fp8 numerics (hpu_nb.emulator.fp8: the same quantisation and delayed scaling, float32
accumulation, bfloat16 outputs). fp8 needs Gaudi2 or newer: on an emulated first-generation Gaudi, fp8_autocast
refuses, as Habana's does. Test membership with isinstance(m, te.Linear), as on a Gaudi.
"""

from __future__ import annotations

from habana_frameworks.torch.hpex.experimental.transformer_engine import distributed, fp8, recipe
from habana_frameworks.torch.hpex.experimental.transformer_engine.fp8 import fp8_autocast
from habana_frameworks.torch.hpex.experimental.transformer_engine.module import Linear

__emulated__ = True
__all__ = ["Linear", "distributed", "fp8", "fp8_autocast", "recipe"]

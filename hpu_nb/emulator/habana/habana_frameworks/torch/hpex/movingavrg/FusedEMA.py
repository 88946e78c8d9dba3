"""habana_frameworks.torch.hpex.movingavrg.FusedEMA, emulated: Habana's fused model EMA on the emulated Gaudi.

Models the bridge's hpex/movingavrg/FusedEMA.py (YOLO-style model EMA): a deep copy of the model in eval mode,
the decay ramp decay * (1 - exp(-updates / 2000)), and one fused update of every state-dict entry (parameters and
buffers): ema = ema * d + (1 - d) * value.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from copy import deepcopy

import torch
from habana_frameworks.torch.core import step_closure
from habana_frameworks.torch.hpex.optimizers import _kernels
from torch import nn

__emulated__ = True


def is_parallel(model: nn.Module) -> bool:
    return type(model) in (nn.parallel.DataParallel, nn.parallel.DistributedDataParallel)


def copy_attr(a: object, b: object, include: Iterable[str] = (), exclude: Iterable[str] = ()) -> None:
    """Copy b's public attributes to a (only `include` if given, never `exclude`)."""
    include, exclude = tuple(include), tuple(exclude)
    for k, v in b.__dict__.items():
        if (include and k not in include) or k.startswith("_") or k in exclude:
            continue
        setattr(a, k, v)


class FusedEMA:
    """An exponential moving average of a model's state dict, kept in `self.ema`."""

    def __init__(self, model: nn.Module, decay: float = 0.9999, updates: float = 0) -> None:
        if not decay >= 0.0:
            raise ValueError(f"Invalid decay value: {decay}")
        self.ema = deepcopy(model.module if is_parallel(model) else model).eval()
        self.decay = lambda x: decay * (1 - math.exp(-x / 2000))  # ramps up over the first few thousand updates
        self.updates = updates
        self.updated_ema = list(self.ema.state_dict().values())

    def update(self, model: nn.Module) -> None:
        step_closure._mark_step_if_lazy()
        values = list(model.state_dict().values())
        with torch.no_grad():
            self.updates += 1
            d = torch.tensor([self.decay(self.updates)])
            _kernels.ema(values, self.updated_ema, d)
        step_closure._mark_step_if_lazy()

    def update_attr(self, model: nn.Module, include: Iterable[str] = (),
                    exclude: Iterable[str] = ("process_group", "reducer")) -> None:
        copy_attr(self.ema, model, include, exclude)

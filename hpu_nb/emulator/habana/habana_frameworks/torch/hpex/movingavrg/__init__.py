"""habana_frameworks.torch.hpex.movingavrg, emulated: Habana's fused model EMA (FusedEMA)."""

from habana_frameworks.torch.hpex.movingavrg.FusedEMA import FusedEMA

__emulated__ = True
__all__ = ["FusedEMA"]

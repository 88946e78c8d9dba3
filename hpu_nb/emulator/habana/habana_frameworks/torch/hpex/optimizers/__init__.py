"""habana_frameworks.torch.hpex.optimizers, emulated: Habana's fused optimizers, with the bridge's names, arguments,
checks and update maths (hpex/optimizers/*.py and their kernels), computed with torch's ops on the emulated Gaudi."""

from habana_frameworks.torch.hpex.optimizers.FusedAdagrad import FusedAdagrad
from habana_frameworks.torch.hpex.optimizers.FusedAdamW import FusedAdamW
from habana_frameworks.torch.hpex.optimizers.FusedLamb import FusedLamb
from habana_frameworks.torch.hpex.optimizers.FusedLars import FusedLars
from habana_frameworks.torch.hpex.optimizers.FusedResourceApplyMomentum import FusedResourceApplyMomentum
from habana_frameworks.torch.hpex.optimizers.FusedSGD import FusedSGD
from habana_frameworks.torch.hpex.optimizers.MarkstepAdam import Adam
from habana_frameworks.torch.hpex.optimizers.MarkstepAdamW import AdamW

__emulated__ = True
__all__ = ["Adam", "AdamW", "FusedAdagrad", "FusedAdamW", "FusedLamb", "FusedLars", "FusedResourceApplyMomentum",
           "FusedSGD"]

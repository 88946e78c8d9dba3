"""habana_frameworks.torch.hpex.normalization, emulated: Habana's fused RMSNorm and gradient-norm clipping.

The bridge's module layout (hpex/normalization/<Name>.py, release 1.19), computed with torch's ops on the emulated
Gaudi.
"""

from habana_frameworks.torch.hpex.normalization.FusedClipNorm import FusedClipNorm
from habana_frameworks.torch.hpex.normalization.FusedRMSNorm import FusedRMSNorm, RmsNormBwdMode

__emulated__ = True

__all__ = ["FusedClipNorm", "FusedRMSNorm", "RmsNormBwdMode"]

"""habana_frameworks.torch.hpex.kernels, emulated: Habana's fused kernels (attention, rotary embedding, CTC loss).

The names Gaudi code imports from here, with the bridge's module layout (hpex/kernels/<Name>.py, release 1.19),
computed with torch's CPU ops on the emulated Gaudi. Not emulated: CustomSoftmax, the fp8 SDPA, PySDPA, EmbeddingBag.
"""

from habana_frameworks.torch.hpex.kernels.CTCLoss import CTCLoss
from habana_frameworks.torch.hpex.kernels.FusedSDPA import FusedSDPA, gqa_output_reshape
from habana_frameworks.torch.hpex.kernels.RotaryPosEmbeddingHelper import (
    RotaryPosEmbeddingHelperV1,
    RotaryPosEmbeddingHelperV2,
    RotaryPosEmbeddingHelperV3,
    RotaryPosEmbeddingMode,
    apply_rotary_pos_emb,
)

__emulated__ = True

__all__ = [
    "CTCLoss",
    "FusedSDPA",
    "RotaryPosEmbeddingHelperV1",
    "RotaryPosEmbeddingHelperV2",
    "RotaryPosEmbeddingHelperV3",
    "RotaryPosEmbeddingMode",
    "apply_rotary_pos_emb",
    "gqa_output_reshape",
]

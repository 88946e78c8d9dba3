"""Lightning Fabric on Gaudi: `Fabric(accelerator="hpu", devices=N, strategy=..., precision=...)`.

The names lightning-habana's Fabric users know. `HPUAccelerator` and `HPUCheckpointIO` are the very classes the
Trainer uses; the strategies and precision plugins are Fabric-shaped adapters of the Trainer's pieces.
"""

from hpu_nb.core.accelerator import HPUAccelerator  # noqa: F401
from hpu_nb.core.checkpoint_io import HPUCheckpointIO  # noqa: F401
from hpu_nb.core.fabric.precision import HPUFSDPPrecision, HPUPrecision  # noqa: F401
from hpu_nb.core.fabric.strategies import HPUDDPStrategy, HPUFSDPStrategy, HPUParallelStrategy, SingleHPUStrategy  # noqa: F401
from hpu_nb.wiring.flavours import FABRIC_NAMES

__all__ = list(FABRIC_NAMES)  # one list of the Fabric names, for both packages

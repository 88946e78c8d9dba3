"""Lightning Fabric on Gaudi (`lightning.fabric`): `from hpu_nb.fabric import HPUFSDPStrategy, HPUPrecision, ...`.

The names of lightning-habana's `lightning_habana.fabric`. For the standalone `lightning_fabric` package use
`hpu_nb.lightning_fabric`.
"""

from hpu_nb.core.fabric import *  # noqa: F403
from hpu_nb.core.fabric import __all__  # noqa: F401

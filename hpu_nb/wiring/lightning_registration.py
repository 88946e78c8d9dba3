"""Run hpu_nb's Lightning registration once Lightning is imported, without importing it ourselves.

`import hpu_nb` must stay cheap, yet `Trainer(accelerator="hpu")` and `Fabric(accelerator="hpu")` must work whichever
package the user imported first, and for both Lightning distributions: `lightning` (`lightning.pytorch` and
`lightning.fabric`) and the standalone `pytorch_lightning` / `lightning_fabric`, which have registries of their own.
If a target is already loaded we register now; otherwise registration follows its import
(hpu_nb/wiring/after_import.py).
"""

from __future__ import annotations

import functools
import sys

from hpu_nb.wiring import flavours
from hpu_nb.wiring.after_import import after_import, is_initializing

# module -> flavour of hpu_nb.core to register with it ("lightning": hpu_nb.core; "standalone": its translation)
TARGETS = {
    "lightning.pytorch": "lightning",
    "pytorch_lightning": "standalone",
    "lightning_fabric": "standalone",
}
# The last module each package's __init__ imports: when torch's autoload brings hpu_nb in while the package is still
# executing (`import pytorch_lightning` imports torch first), registration waits for this one.
# tests/core/test_lightning_tripwire.py fails if a Lightning release moves it.
LAST_IMPORT = {name: f"{name}._graveyard" for name in TARGETS}


def _register(trigger: str) -> None:
    if trigger == "lightning_fabric" and is_initializing("pytorch_lightning"):
        return  # pytorch_lightning is importing lightning_fabric: registration follows once pytorch_lightning is loaded
    flavours.core_module(TARGETS[trigger], "registration").register_all()


def install() -> None:
    """Register with each Lightning package that is loaded, and hook the ones that are not (yet)."""
    for name in TARGETS:
        callback = functools.partial(_register, name)
        if name not in sys.modules:
            after_import(name, callback)
        elif is_initializing(name):
            after_import(LAST_IMPORT[name], callback)
        else:
            callback()

"""Fake habana_frameworks.torch.utils.internal: is_lazy(), read once per process as Habana's is.

Only the literal "0" means eager; unset means the release's default ("1" up to 1.20, "0" from 1.21).
"""

import os

from habana_frameworks._fake import STATE as _STATE
from habana_frameworks._fake import recorded as _recorded


@_recorded
def is_lazy():
    if is_lazy._is_lazy is None:
        default = "1" if _STATE.config.lazy_by_default else "0"
        is_lazy._is_lazy = os.getenv("PT_HPU_LAZY_MODE", default) != "0"
    return is_lazy._is_lazy


is_lazy._is_lazy = None

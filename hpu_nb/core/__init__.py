"""Lightning integration for Gaudi: accelerator, strategies, precision, checkpoint IO, profiler.

Lightning is imported here, before any module of this package, so that the registration hook
(hpu_nb.wiring.lightning_registration) never sees one of our modules half-initialised.
"""

import lightning.pytorch  # noqa: F401

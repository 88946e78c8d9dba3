"""Lets `import habana_frameworks` be a program's first line on the emulated Gaudi (installed as `hpu_nb-habana.pth`).

Habana's examples start with `import habana_frameworks.torch.core as htcore`, before `import torch`; without this the
emulated package exists only once torch's autoload has imported hpu_nb. Python runs the `.pth` line at start-up: it
appends one finder to the end of `sys.meta_path`, nothing more (no hpu_nb import: a program that never imports
`habana_frameworks` pays for this small module only; benchmarks/bench_autoload.py measures it). Being last, the finder
is asked only after the path finders found no `habana_frameworks`, so Habana's real package always wins where it is
installed; only then does it import hpu_nb's emulated package (and so for `intel_transformer_engine`, which Habana's
transformer engine wraps and accelerate looks for by name). It also makes the emulated release visible as the
installed distribution `habana-torch-plugin` (hpu_nb/emulator/distribution). Neither happens where a `habana_frameworks`
package lies on sys.path at start-up, nor with HPU_NB_AUTOLOAD=0 (as for torch's autoload).
"""

import os
import sys

PACKAGE = "habana_frameworks"
TE_PACKAGE = "intel_transformer_engine"  # what Habana's transformer engine wraps (1.19+): fp8 checks ask for it by name
# The emulated release as an installed distribution (`pip list`, importlib.metadata): see its README.
DISTRIBUTION_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hpu_nb", "emulator", "distribution")


class HabanaFallbackFinder:  # a MetaPathFinder, duck-typed: importlib.abc would cost milliseconds at every start-up
    """Finds the emulated `habana_frameworks` when no installed one was found before it."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in (PACKAGE, TE_PACKAGE):
            return None
        # this also installs hpu_nb's own finder (torch.hpu); idempotent
        from hpu_nb.emulator import habana  # noqa: PLC0415 -- lazy: a start-up module imports hpu_nb only when asked

        return habana.emulated_spec(fullname)


def habana_is_installed() -> bool:
    """Whether a `habana_frameworks` package lies on sys.path (Habana's; a stat per entry, no import)."""
    return any(os.path.isdir(os.path.join(entry or ".", PACKAGE)) for entry in sys.path)


def install() -> None:
    """Append the finder and the emulated release's metadata once (the `.pth` line calls this at interpreter start),
    unless Habana's software is installed or HPU_NB_AUTOLOAD=0."""
    if os.environ.get("HPU_NB_AUTOLOAD", "1").strip() == "0" or habana_is_installed():
        return
    if not any(type(finder).__name__ == HabanaFallbackFinder.__name__ for finder in sys.meta_path):
        sys.meta_path.append(HabanaFallbackFinder())
    if DISTRIBUTION_DIR not in sys.path and os.path.isdir(DISTRIBUTION_DIR):
        sys.path.append(DISTRIBUTION_DIR)

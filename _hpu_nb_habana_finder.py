"""Lets `import habana_frameworks` be a program's first line on the emulated Gaudi (installed as `hpu_nb-habana.pth`).

Habana's examples start with `import habana_frameworks.torch.core as htcore`, before `import torch`; without this the
emulated package exists only once torch's autoload has imported hpu_nb. Python runs the `.pth` line at start-up: it
appends one finder to the end of `sys.meta_path`, nothing more (no hpu_nb import: a program that never imports
`habana_frameworks` pays for this small module only; benchmarks/bench_autoload.py measures it). Being last, the finder
is asked only after the path finders found no `habana_frameworks`, so Habana's real package always wins where it is
installed; only then does it import hpu_nb's emulated package (and so for `habana_dataloader`, Habana's media data
loader, and `intel_transformer_engine`, which Habana's transformer engine wraps and accelerate looks for by name). It
also makes the emulated release visible as the installed distribution `habana-torch-plugin`
(hpu_nb/emulator/distribution). Neither happens where a `habana_frameworks`
package lies on sys.path at start-up, nor with HPU_NB_AUTOLOAD=0 (as for torch's autoload).

The same finder answers `import lightning_habana` (and its module paths) where the archived plugin is not installed:
being last, it is asked only when no `lightning_habana` was found on sys.path; it then serves hpu_nb's classes under
the plugin's names (hpu_nb/lightning_habana_names.py). That works on a Gaudi too, so the finder is appended wherever
HPU_NB_AUTOLOAD is not 0; only its `habana_frameworks` part depends on Habana's software being absent.
"""

import os
import sys

PACKAGE = "habana_frameworks"
LIGHTNING_HABANA = "lightning_habana"  # the archived lightning-habana plugin's package: hpu_nb serves its names
LIGHTNING_HABANA_PREFIX = LIGHTNING_HABANA + "."
NAMES_MARK = "__hpu_nb_names__"  # on the modules hpu_nb serves (hpu_nb.lightning_habana_names.MARK)
TE_PACKAGE = "intel_transformer_engine"  # what Habana's transformer engine wraps (1.19+): fp8 checks ask for it by name
DATALOADER_PACKAGE = "habana_dataloader"  # Habana's media data loader: Model-References' scripts import it by name
# The emulated release as an installed distribution (`pip list`, importlib.metadata): see its README.
DISTRIBUTION_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hpu_nb", "emulator", "distribution")


class HabanaFallbackFinder:  # a MetaPathFinder, duck-typed: importlib.abc would cost milliseconds at every start-up
    """Finds the emulated `habana_frameworks` when no installed one was found before it (unless Habana's software was
    on sys.path at start-up), and hpu_nb's `lightning_habana` module paths when no installed plugin was."""

    def __init__(self, emulate_habana=True):
        self.emulate_habana = emulate_habana

    def find_spec(self, fullname, path=None, target=None):
        if fullname == LIGHTNING_HABANA or fullname.startswith(LIGHTNING_HABANA_PREFIX):
            if fullname != LIGHTNING_HABANA and not getattr(sys.modules.get(LIGHTNING_HABANA), NAMES_MARK, False):
                return None  # a real lightning_habana is imported: a submodule it lacks is not hpu_nb's to give
            from hpu_nb import lightning_habana_names  # noqa: PLC0415 -- lazy, as below

            return lightning_habana_names.find_spec(fullname)
        if not self.emulate_habana or fullname not in (PACKAGE, TE_PACKAGE, DATALOADER_PACKAGE):
            return None
        # this also installs hpu_nb's own finder (torch.hpu); idempotent
        from hpu_nb.emulator import habana  # noqa: PLC0415 -- lazy: a start-up module imports hpu_nb only when asked

        return habana.emulated_spec(fullname)


def habana_is_installed() -> bool:
    """Whether a `habana_frameworks` package lies on sys.path (Habana's; a stat per entry, no import)."""
    return any(os.path.isdir(os.path.join(entry or ".", PACKAGE)) for entry in sys.path)


def install() -> None:
    """Append the finder once (the `.pth` line calls this at interpreter start) unless HPU_NB_AUTOLOAD=0, and the
    emulated release's metadata unless Habana's software is installed."""
    if os.environ.get("HPU_NB_AUTOLOAD", "1").strip() == "0":
        return
    emulate_habana = not habana_is_installed()
    if not any(type(finder).__name__ == HabanaFallbackFinder.__name__ for finder in sys.meta_path):
        sys.meta_path.append(HabanaFallbackFinder(emulate_habana))
    if emulate_habana and DISTRIBUTION_DIR not in sys.path and os.path.isdir(DISTRIBUTION_DIR):
        sys.path.append(DISTRIBUTION_DIR)

"""torch's device-backend autoload entry point (group `torch.backends`), run by `import torch` once hpu_nb is installed.

What Habana's software does on a Gaudi since 1.18, hpu_nb does for the emulated Gaudi: by the end of `import torch`,
`Trainer(accelerator="hpu")` and `habana_frameworks` resolve without `import hpu_nb`; `torch.hpu` and the "hccl"
process-group backend exist where Habana's autoload would make them (eager mode, or PT_HPU_AUTOLOAD=1), their modules
imported at first use; and the emulated device's library (when built) is loaded before any code can ask torch which
accelerators exist, its kernels registered when the device is first used. It costs a few ms and touches no device
(benchmarks/bench_autoload.py measures it). Off with HPU_NB_AUTOLOAD=0 (read by the entry point module,
`_hpu_nb_autoload`, before hpu_nb is imported) or torch's own TORCH_DEVICE_BACKEND_AUTOLOAD=0.
"""

from __future__ import annotations

import importlib
import os

# Importing this module ran hpu_nb/__init__.py: Lightning learns "hpu" when imported, and the emulated
# habana_frameworks is findable.
from hpu_nb.emulator import habana as emulated_habana
from hpu_nb.runtime.habana_install import real_habana_spec

AUTOLOAD_ENV = "HPU_NB_AUTOLOAD"
GPU_MIGRATION_ENV = "PT_HPU_GPU_MIGRATION"  # read by habana_frameworks.torch (gpu_migration/__init__.py has the rule)


def load() -> None:
    if os.environ.get(AUTOLOAD_ENV, "1").strip() == "0":
        return
    if real_habana_spec() is not None:
        return  # Habana's software provides the hpu device (its own autoload entry point loads it)
    from hpu_nb.emulator import hpu_device  # noqa: PLC0415 -- lazy: never needed on a Gaudi

    if not hasattr(hpu_device, "load_library_if_built"):  # half made: `import torch` is its own (hpu_device's top)
        hpu_device.when_imported = _load_emulated_device
        return
    _load_emulated_device()


def _load_emulated_device() -> None:
    """The library (when built), and what Habana's autoload would import: torch.hpu, HCCL at first use."""
    from hpu_nb.emulator import hpu_device  # noqa: PLC0415 -- lazy: never needed on a Gaudi
    from hpu_nb.runtime.generations import EMULATED_RELEASE  # noqa: PLC0415 -- lazy: never needed on a Gaudi

    try:
        hpu_device.load_library_if_built()
        if EMULATED_RELEASE.autoloads(os.environ):  # what Habana's autoload imports: its hpu module and HCCL
            emulated_habana.install_torch_hpu()
            hpu_device.hccl.register_for_first_use()
            if os.environ.get(GPU_MIGRATION_ENV, "").strip().lower() not in ("", "0", "false"):
                # Habana's autoload imports habana_frameworks.torch, which starts the GPU Migration Toolkit when the
                # variable asks for it: CUDA code then runs on hpu after a plain `import torch`, as on a Gaudi.
                importlib.import_module("habana_frameworks.torch")
    except Exception:
        return

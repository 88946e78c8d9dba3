"""habana_frameworks.torch.gpu_migration, emulated: Habana's GPU Migration Toolkit, on the emulated Gaudi.

`import habana_frameworks.torch.gpu_migration` (or PT_HPU_GPU_MIGRATION=1, which the bridge reads when
habana_frameworks.torch is imported) makes CUDA-written code run on `hpu`, as the toolkit does on a Gaudi:
`torch.cuda.*` answers for the (emulated) card; `device="cuda"`, `.to("cuda")`, `.cuda()` land on hpu;
`torch.autocast("cuda")` and `torch.cuda.amp.autocast` run Habana's bf16 autocast; a GradScaler for cuda
(`torch.amp.GradScaler("cuda")`, `torch.cuda.amp.GradScaler`) is disabled; NCCL is HCCL (and Lightning's
accelerator="auto" is the HPU: hpu_nb.core.registration). GPU_MIGRATION_LOG_LEVEL=1|2|3 logs every migrated call
(see _log). Importing it changes this process for good, as Habana's does; a process that neither imports it nor sets
the variable is left alone (torch.cuda stays torch's).

Modelled on Habana's toolkit (shipped in Intel's Gaudi images, not in the public bridge repository), read for what it
maps, logs and refuses; written here for the emulated Gaudi, its code not copied. Which modules model which of its
files is said in each one. Not modelled: its apex and pynvml stand-ins, DataLoader's pin_memory_device="hpu",
PT_HPU_CONVERT_FP16_TO_BF16_FOR_MIGRATION, and its check that torch is the release's own version (the emulated Gaudi
runs on the torch installed).
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from typing import Any

import habana_frameworks.torch.hpu  # noqa: F401  (as Habana's: needs the hpu device and torch.hpu)

SWITCH_ENV = "PT_HPU_GPU_MIGRATION"

# What was replaced, and by what: {(owner, name): (torch's original, the migrated one)}. Tests and %hpu_info read it.
REPLACED: dict[tuple[Any, str], tuple[Any, Any]] = {}


def _check_switch() -> None:
    """The bridge reads PT_HPU_GPU_MIGRATION as a bool flag (backend/synapse_helpers/env_flags.cpp): 1 / true / 0 /
    false in any case, unset or empty meaning off; any other value stops the process."""
    value = os.environ.get(SWITCH_ENV)
    if value and value.lower() not in ("1", "true", "0", "false"):
        raise ValueError(f'Environment variable "{SWITCH_ENV}"="{value}" couldn\'t be converted properly'
                         " (1 / true turn the GPU Migration Toolkit on, 0 / false off).")


def _replace(owner: Any, name: str, new: Any) -> None:
    if (owner, name) in REPLACED:
        return
    REPLACED[(owner, name)] = (owner.__dict__.get(name, getattr(owner, name, None)), new)
    setattr(owner, name, new)


def _activate() -> None:
    from habana_frameworks.torch.gpu_migration import _cuda, _distributed, _torch  # noqa: PLC0415 -- after torch.hpu
    from habana_frameworks.torch.gpu_migration._log import LOG  # noqa: PLC0415

    _check_switch()
    if importlib.util.find_spec("apex") is None:  # as Habana's: it says so at every import where apex is absent
        warnings.warn("apex not installed, gpu_migration will not swap api for this package.", stacklevel=2)
    _cuda.install(_replace)
    _torch.install(_replace)
    _distributed.install(_replace)
    LOG.configure(os.environ)


_activate()

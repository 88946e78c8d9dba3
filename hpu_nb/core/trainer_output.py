"""What an HPU Trainer prints when it is built: one line naming the HPU backend, not Lightning's GPU / TPU lines.

Lightning's Trainer logs "GPU available: ..." and "TPU available: ..." (then advertising tips) from
`lightning.pytorch.trainer.setup._log_device_info` while it is constructed. For a Trainer on HPU those lines say
nothing useful, and nothing says which HPU backend runs until `fit`: `install()` wraps that function so an HPU Trainer
logs one line instead, at construction (saying plainly when the Gaudi is emulated); the tips that follow and the
accelerator's "HPU available" line at `fit` (the same fact again) are left out. Other Trainers are untouched.
Lightning 2.6 with torch 2.13 also warns "`isinstance(treespec, LeafSpec)` is deprecated" (a FutureWarning) from its
own _pytree on every fit, constructing torch's deprecated `LeafSpec()`: nothing a user can act on, and an error under
`-W error::FutureWarning` (lightning-habana's pytest settings). Where torch has the replacement it names
(`treespec_leaf()`, the same leaf spec, made once), Lightning's _pytree gets it in that name's place, so the warning
is never raised; elsewhere the one message is ignored. The wrap is idempotent.
"""

from __future__ import annotations

import functools
import logging
import threading
import warnings
from collections.abc import Callable
from typing import Any

from lightning.pytorch.trainer import setup as trainer_setup
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from typing_extensions import override

from hpu_nb.core.selection import is_hpu_accelerator
from hpu_nb.runtime import get_backend

RANK_ZERO_LOGGER = "lightning.pytorch.utilities.rank_zero"
DROPPED_PREFIXES = ("💡 Tip:", "HPU available:")  # while an HPU Trainer is built and runs
_state = threading.local()


def hpu_device_line(trainer: Any) -> str:
    """`HPU: using 2 of 8 x GAUDI2 (emulated Gaudi on the CPU)`."""
    backend = get_backend()
    return f"HPU: using {trainer.num_devices} of {backend.device_count()} x {backend.device_name()} ({backend.kind})"


class HPUTrainerNoiseFilter(logging.Filter):
    """After an HPU Trainer's device line (until a non-HPU Trainer is built): drops tips and the repeated HPU line."""

    @override
    def filter(self, record: logging.LogRecord) -> bool:
        return not (getattr(_state, "hpu_trainer", False) and str(record.msg).startswith(DROPPED_PREFIXES))


def install() -> bool:
    """Wrap Lightning's `_log_device_info` (once). Returns False when this Lightning has no such function."""
    original: Callable[[Any], None] | None = getattr(trainer_setup, "_log_device_info", None)
    if original is None:
        return False
    if not _leaf_spec_without_warning():
        # (re)applied on every call: a warnings.catch_warnings block around an earlier call may have dropped it
        warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                                category=FutureWarning, module=r"lightning\.pytorch\.utilities\._pytree")
    if getattr(original, "_hpu_nb_wrapped", False):
        return True

    @functools.wraps(original)
    def _log_device_info(trainer: Any) -> None:
        _state.hpu_trainer = False
        if not is_hpu_accelerator(trainer.accelerator):
            return original(trainer)
        rank_zero_info(hpu_device_line(trainer))
        _state.hpu_trainer = True
        return None

    # a function takes any attribute; its type declares none
    _log_device_info._hpu_nb_wrapped = True  # type: ignore[attr-defined]
    trainer_setup._log_device_info = _log_device_info
    logger = logging.getLogger(RANK_ZERO_LOGGER)
    if not any(isinstance(f, HPUTrainerNoiseFilter) for f in logger.filters):
        logger.addFilter(HPUTrainerNoiseFilter())
    return True


def _leaf_spec_without_warning() -> bool:
    """Lightning's _pytree builds `LeafSpec()` (its `_tree_flatten`, on every batch); torch 2.13 deprecates that class
    with a FutureWarning at construction and offers `treespec_leaf()`, the same spec. Give Lightning's module that
    factory under the name it calls (tests/core/test_lightning_tripwire.py fingerprints `_tree_flatten`). False where
    this torch has no treespec_leaf (its LeafSpec does not warn)."""
    from lightning.pytorch.utilities import _pytree as lightning_pytree  # noqa: PLC0415 -- only once Lightning is in
    from torch.utils import _pytree as torch_pytree  # noqa: PLC0415

    leaf = getattr(torch_pytree, "treespec_leaf", None)
    if leaf is None:
        return False
    if getattr(lightning_pytree, "LeafSpec", None) is not leaf:
        lightning_pytree.LeafSpec = leaf  # type: ignore[misc]  # a factory of the same spec, in the class's name
    return True

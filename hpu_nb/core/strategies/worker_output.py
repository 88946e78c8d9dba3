"""Forked workers' notebook output: moved to hpu_nb.core.strategy_parts.worker_output (shared by the Trainer and
Fabric); its public names stay importable here."""

from hpu_nb.core.strategy_parts.worker_output import *  # noqa: F403

"""The processes of a job's ranks: moved to hpu_nb.core.strategy_parts.rank_processes (shared by the Trainer and
Fabric); its public names stay importable here."""

from hpu_nb.core.strategy_parts.rank_processes import *  # noqa: F403

"""The collective timeout, progress reports and StuckRankError: moved to hpu_nb.core.strategy_parts.liveness (shared
by the Trainer and Fabric); its public names stay importable here."""

from hpu_nb.core.strategy_parts.liveness import *  # noqa: F403

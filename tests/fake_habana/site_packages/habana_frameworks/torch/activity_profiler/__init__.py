from .activity_profiler import *  # noqa: F403  (importing it makes the swap, as in Habana's package)

from .activity_profiler import *  # noqa: F401,F403  (importing it makes the swap, as in Habana's package)

"""torch's device-backend autoload entry point for hpu_nb (group `torch.backends`), outside the hpu_nb package.

`import torch` runs `load()`. It lives in a top-level module of its own so that HPU_NB_AUTOLOAD=0 really leaves hpu_nb
unimported (an entry point inside the package would import hpu_nb/__init__.py, and with it the Lightning hooks, just
to read the switch).
"""

import os


def load() -> None:
    if os.environ.get("HPU_NB_AUTOLOAD", "1").strip() == "0":
        return
    from hpu_nb.wiring.torch_autoload import load as load_hpu_nb  # noqa: PLC0415 -- lazy: HPU_NB_AUTOLOAD=0 skips hpu_nb

    load_hpu_nb()

"""Warnings that point at the user's line, not at hpu_nb's.

`warnings.warn` (and Lightning's `rank_zero_warn`) show the file and source line of the frame `stacklevel` above them:
from inside hpu_nb that was hpu_nb's own file and its `rank_zero_warn(...)` line, which tells a notebook user nothing
(tutorial 02 showed `.../hpu_nb/core/fabric/precision.py:104` and `rank_zero_warn(f"...")`). Here the warning is
attributed to the first frame outside hpu_nb, Lightning and torch: the user's cell or script line that built the object,
as pandas' `find_stack_level` does. Only rank 0 warns, as with `rank_zero_warn`.
"""

from __future__ import annotations

import os
import sys
import warnings
from types import FrameType

from lightning.fabric.utilities.rank_zero import rank_zero_only

__all__ = ["warn_at_user_code"]


def _library_dirs() -> tuple[str, ...]:
    import lightning.fabric  # noqa: PLC0415 -- already imported by the caller's module
    import lightning.pytorch  # noqa: PLC0415 -- as above
    import torch  # noqa: PLC0415 -- as above

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # hpu_nb/
    modules = (lightning.fabric, lightning.pytorch, torch)
    return (package + os.sep, *(os.path.dirname(module.__file__ or "") + os.sep for module in modules))


def warn_at_user_code(message: str, category: type[Warning] = UserWarning) -> None:
    """Warn `message`, shown at the first calling line outside hpu_nb, Lightning and torch (rank 0 only)."""
    if getattr(rank_zero_only, "rank", 0) != 0:
        return
    libraries = _library_dirs()
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename.startswith(libraries)
                                 or frame.f_code.co_filename.startswith("<frozen")):
        frame = frame.f_back
    if frame is None:
        warnings.warn(message, category, stacklevel=2)
        return
    warnings.warn_explicit(message, category, frame.f_code.co_filename, frame.f_lineno,
                           module=frame.f_globals.get("__name__"),
                           registry=frame.f_globals.setdefault("__warningregistry__", {}),
                           module_globals=frame.f_globals)

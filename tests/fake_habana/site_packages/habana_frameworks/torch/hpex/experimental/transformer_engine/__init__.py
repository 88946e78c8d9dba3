"""Fake habana_frameworks.torch.hpex.experimental.transformer_engine (`te`).

From Gaudi software 1.19 it is a shim, as Habana's is: it re-exports `intel_transformer_engine` (classes keep that
module name; its submodules are aliased under this name in sys.modules). Up to 1.18 the engine lived here: the
classes are this module's own.
"""

import contextlib
import importlib
import sys

from habana_frameworks._fake import STATE as _STATE

_te = importlib.import_module("intel_transformer_engine")

if _STATE.config.release_tuple >= (1, 19):
    for _name in dir(_te):
        if not _name.startswith("__"):
            _attr = getattr(_te, _name)
            if isinstance(_attr, type(sys)):
                sys.modules[f"{__name__}.{_name}"] = _attr
            globals()[_name] = _attr
    __all__ = [n for n in dir(_te) if not n.startswith("__")]
else:
    from intel_transformer_engine import fp8, recipe  # noqa: F401

    class Linear(_te.Linear):
        """te.Linear of Gaudi software up to 1.18 (defined in habana_frameworks)."""

    @contextlib.contextmanager
    def fp8_autocast(enabled=True, fp8_recipe=None, **kwargs):
        with _te.fp8_autocast(enabled=enabled, fp8_recipe=fp8_recipe, **kwargs):
            yield

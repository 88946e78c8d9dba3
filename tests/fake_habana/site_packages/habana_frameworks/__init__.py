"""Fake habana_frameworks for hpu_nb's tests (the real one ships in Intel's Gaudi images). See _fake.py."""

from habana_frameworks._fake import STATE as _STATE

__version__ = _STATE.config.version

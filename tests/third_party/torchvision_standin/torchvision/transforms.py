"""torchvision.transforms stand-in (see the package docstring): importable, and any use of it is an error."""

from __future__ import annotations

from typing import NoReturn


def __getattr__(name: str) -> NoReturn:
    if name.startswith("__"):
        raise AttributeError(name)
    raise RuntimeError(
        f"torchvision.transforms.{name}: this is hpu_nb's test stand-in for torchvision (no CPU torchvision installs"
        " here); the test that got here needs the real torchvision."
    )

"""habana_frameworks.torch, emulated: importing it makes the `hpu` device usable, as Habana's does."""

from habana_frameworks.torch import core, hpu  # noqa: F401  (registers torch.hpu and loads the device)

__emulated__ = True

"""habana_frameworks.torch.hpex.experimental, emulated (the transformer engine lives below)."""

__emulated__ = True

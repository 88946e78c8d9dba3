"""Fake habana_frameworks.torch.hpex."""

"""Fake habana_frameworks.torch.utils."""

"""Fake habana_frameworks.torch.distributed."""

"""habana_frameworks.torch.distributed, emulated."""

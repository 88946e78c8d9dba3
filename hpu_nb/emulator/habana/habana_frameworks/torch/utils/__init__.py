"""habana_frameworks.torch.utils, emulated."""

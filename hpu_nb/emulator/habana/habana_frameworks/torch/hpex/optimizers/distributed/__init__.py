"""habana_frameworks.torch.hpex.optimizers.distributed, emulated: functional optimizers for torch.distributed's
optimizer hooks (import the module: `...distributed.FusedAdamW`; the package exports nothing, as the bridge's)."""

__emulated__ = True

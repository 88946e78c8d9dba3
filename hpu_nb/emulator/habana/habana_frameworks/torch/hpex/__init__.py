"""habana_frameworks.torch.hpex, emulated: Habana's extensions (fused kernels, optimizers, normalization, the
transformer engine), computed with torch's CPU ops on the emulated Gaudi. Subpackages import on demand."""

__emulated__ = True

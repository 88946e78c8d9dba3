"""habana_frameworks.torch, emulated: importing it makes the `hpu` device usable, as Habana's does."""

from habana_frameworks.torch import core, hpu  # noqa: F401  (registers torch.hpu and loads the device)

__emulated__ = True
if __import__("os").environ.get("PT_HPU_GPU_MIGRATION", "").lower() not in ("", "0", "false"):  # read here, as Habana's
    import habana_frameworks.torch.gpu_migration  # noqa: F401  (the GPU Migration Toolkit; it refuses a non-bool value)

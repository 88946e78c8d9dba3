"""habana_frameworks.torch.utils.internal, emulated: the execution mode."""

from habana_frameworks.torch.core import is_lazy  # noqa: F401

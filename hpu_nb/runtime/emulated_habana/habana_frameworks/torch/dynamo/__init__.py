"""habana_frameworks.torch.dynamo, emulated: importing it registers `torch.compile(..., backend="hpu_backend")`.

hpu_nb registers the emulated backend on its own when dynamo is imported; this module exists for code that imports
Habana's module explicitly (`import habana_frameworks.torch.dynamo`).
"""

from hpu_nb.runtime.compile_backend import _register, hpu_backend  # noqa: F401

__emulated__ = True
_register()

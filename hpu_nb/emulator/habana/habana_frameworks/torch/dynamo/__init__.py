"""habana_frameworks.torch.dynamo, emulated: importing it registers `torch.compile(..., backend="hpu_backend")`.

torch also finds the emulated backend through hpu_nb's `torch_dynamo_backends` entry point; this module exists for
code that imports Habana's module explicitly (`import habana_frameworks.torch.dynamo`).
"""

from hpu_nb.runtime.compile_backend import hpu_backend, register  # noqa: F401

__emulated__ = True
register()

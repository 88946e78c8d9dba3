"""habana_frameworks.torch.dynamo, emulated: importing it registers `torch.compile(..., backend="hpu_backend")`.

torch also finds the emulated backend through hpu_nb's `torch_dynamo_backends` entry point; this module exists for
code that imports Habana's module explicitly (`import habana_frameworks.torch.dynamo`).
"""

from hpu_nb.emulator.graph_compiler import emulated_hpu_backend as hpu_backend  # noqa: F401
from hpu_nb.emulator.graph_compiler import register

__emulated__ = True
register()

"""A stand-in for torchvision, used only by tests/third_party/test_third_party_gaudi_code.py's subprocesses. NOT
torchvision.

Why it exists: optimum-habana 1.21.2's `adapt_transformers_to_gaudi()` (which `GaudiTrainingArguments(use_habana=True)`
calls) imports every model it patches, and one of them (GLM-4V's tokenizer) does `from torchvision import transforms`
at import time. torchvision's PyPI wheels for torch 2.13 link CUDA torch (`libtorch_cuda.so`, `libc10_cuda.so`) and do
not import beside the CPU build of torch this project installs; the CPU build of torchvision is published only on
PyTorch's own wheel index, which this machine cannot reach. Nothing these tests run uses torchvision: only that one
import statement must succeed. So this package lets `from torchvision import transforms` succeed and makes any real
use fail loudly. It is put on the path only when no real torchvision is installed.
"""

from __future__ import annotations

__version__ = "0.0.0+hpu-nb-test-standin"
__standin__ = True

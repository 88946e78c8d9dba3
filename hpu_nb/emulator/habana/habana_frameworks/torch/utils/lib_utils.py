"""habana_frameworks.torch.utils.lib_utils, emulated: where Habana's headers and libraries would be.

As the bridge's: `include` and `lib` next to habana_frameworks.torch. The emulated package ships neither (no Habana
headers or libraries exist here), so a custom-op build that needs them (Model-References' custom_op setup.py files)
fails at its compile step, as it would on a machine without Gaudi software; the paths are still Habana's answer.
"""

from __future__ import annotations

import os

import habana_frameworks.torch as hftorch

__emulated__ = True


def _torch_dir() -> str:
    paths = list(hftorch.__path__)
    assert len(paths) == 1, "Bad __path__ of habana_frameworks.torch, expecting list with 1 element"
    return paths[0]


def get_include_dir() -> str:
    return os.path.join(_torch_dir(), "include")


def get_lib_dir() -> str:
    return os.path.join(_torch_dir(), "lib")

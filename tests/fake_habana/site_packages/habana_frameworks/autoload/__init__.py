"""Fake habana_frameworks.autoload: torch's `torch.backends` entry point (in the habana-torch-plugin distribution).

As Habana's (autoload/__init__.py): `import torch` loads habana_frameworks.torch unless PT_HPU_AUTOLOAD=0; when
PT_HPU_AUTOLOAD is unset it is off in lazy mode (so on by default from 1.21, where eager is the default).
"""

import os

is_loaded = False


def is_autoload_enabled():
    from habana_frameworks._fake import STATE

    value = os.getenv("PT_HPU_AUTOLOAD", "-1")
    if value in ("0", "1"):
        return value == "1"
    default = "1" if STATE.config.lazy_by_default else "0"
    return os.getenv("PT_HPU_LAZY_MODE", default) != "1"


def _device_library():
    """The fake's device is hpu_nb's emulated one: load its library now, as Habana's torch knows the hpu device from
    the start (otherwise torch could settle its HPU support before the library registers it)."""
    try:
        from hpu_nb.emulator import hpu_device

        hpu_device.load_library_if_built()
    except Exception:
        pass


def __autoload():
    global is_loaded
    _device_library()
    if is_loaded or not is_autoload_enabled():
        return
    is_loaded = True
    import habana_frameworks.torch  # noqa: F401

"""`import hpu_nb` is cheap: no torch, no Lightning, no subprocess, no device."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def _run(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_import_touches_nothing_heavy():
    out = _run(
        """
        import subprocess, sys
        started = []
        real_popen = subprocess.Popen.__init__
        def spy(self, *a, **k):
            started.append(a)
            return real_popen(self, *a, **k)
        subprocess.Popen.__init__ = spy
        import hpu_nb
        heavy = [m for m in ("torch", "lightning", "IPython", "ipywidgets", "habana_frameworks") if m in sys.modules]
        print(heavy, len(started))
        """
    )
    assert out == "[] 0"


def test_lightning_learns_hpu_whichever_is_imported_first():
    for order in ("import hpu_nb, lightning.pytorch", "import lightning.pytorch, hpu_nb"):
        out = _run(
            f"""
            {order}
            from lightning.pytorch.accelerators import AcceleratorRegistry
            from lightning.pytorch.strategies import StrategyRegistry
            print("hpu" in AcceleratorRegistry, "hpu_single" in StrategyRegistry)
            """
        )
        assert out == "True True", order


@pytest.mark.parametrize("first", ["import torch", "from hpu_nb.emulator import hpu_device",
                                   "import hpu_nb.emulator.hpu_device.build"])
def test_the_device_library_is_loaded_by_the_end_of_the_first_import_of_torch(first):
    """torch's autoload loads the emulated device's library during `import torch`, whichever module imports torch
    first: also when that is the device's own module (a test suite's conftest, `python -m hpu_nb.emulator.hpu_device`),
    which the autoload finds half made. It was skipped there, and in pytest a later first use of the device came too
    late for torch's hooks: a fake-Gaudi test run first made the next emulated tests fail (DeviceLoadedTooLateError)."""
    out = _run(
        f"""
        {first}
        import sys
        device = sys.modules["hpu_nb.emulator.hpu_device"]
        print(device._library is not None, "when_imported" not in vars(device))
        """
    )
    assert out == "True True", first


def test_public_names_resolve():
    import hpu_nb

    assert hpu_nb.HPUAccelerator.name() == "hpu"
    assert hpu_nb.SingleHPUStrategy.strategy_name == "hpu_single"
    assert hpu_nb.HPUCheckpointIO.__module__ == "hpu_nb.core.checkpoint_io"
    assert callable(hpu_nb.get_backend)

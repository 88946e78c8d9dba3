"""`import hpu_nb` is cheap: no torch, no Lightning, no subprocess, no device."""

from __future__ import annotations

import subprocess
import sys
import textwrap


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


def test_public_names_resolve():
    import hpu_nb

    assert hpu_nb.HPUAccelerator.name() == "hpu"
    assert hpu_nb.SingleHPUStrategy.strategy_name == "hpu_single"
    assert hpu_nb.HPUCheckpointIO.__module__ == "hpu_nb.core.checkpoint_io"
    assert callable(hpu_nb.get_backend)

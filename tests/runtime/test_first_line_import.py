"""`import habana_frameworks` as a program's first line, and the emulated release as installed metadata.

Habana's examples start with `import habana_frameworks.torch.core as htcore`, before `import torch`; optimum-habana
reads the Gaudi software version with `pip list | grep habana-torch-plugin`. Each test runs a fresh interpreter from a
folder outside the repository, so what it finds comes from the installed `hpu_nb-habana.pth`, not from the checkout.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

from hpu_nb.runtime.generations import EMULATED_RELEASE, release_from_version
from tests.fake_habana import SITE as FAKE_HABANA_SITE

REPO = Path(__file__).resolve().parents[2]


def _python(code: str, tmp_path: Path, **env_changes: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPU_NB_", "PT_HPU_", "PYTHONPATH"))}
    for key, value in env_changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])  # as in an activated venv
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def test_the_pth_is_installed_in_this_environment():
    """Both install paths put it at the root of site-packages: build_py for wheels, the editable hook for `-e .`."""
    roots = {Path(p) for p in [*site.getsitepackages(), sysconfig.get_paths()["purelib"]]}
    assert any((root / "hpu_nb-habana.pth").is_file() for root in roots), roots


def test_a_script_whose_first_line_imports_habana_trains_on_the_emulated_gaudi(tmp_path):
    result = _python(
        """
        import habana_frameworks.torch.core as htcore
        import habana_frameworks.torch.hpu as hthpu
        import torch

        torch.manual_seed(0)
        device = torch.device("hpu")
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(64, 8).to(device), torch.randn(64, 1).to(device)
        losses = []
        for _ in range(20):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            htcore.mark_step()
            optimizer.step()
            htcore.mark_step()
            losses.append(loss.item())
        print(getattr(htcore, "__emulated__", False), hthpu.get_device_name(), next(model.parameters()).device,
              losses[-1] < losses[0] * 0.9)
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["True", "GAUDI2", "hpu:0", "True"]


def test_a_program_that_never_imports_habana_loads_nothing_of_hpu_nb(tmp_path):
    result = _python(
        """
        import sys
        print(sorted(m for m in sys.modules if m.startswith(("hpu_nb", "habana_frameworks", "torch"))),
              any(type(f).__name__ == "HabanaFallbackFinder" for f in sys.meta_path))
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]", "True"]


def test_the_emulated_release_is_an_installed_distribution_for_pip_and_importlib(tmp_path):
    result = _python(
        """
        import importlib.metadata, subprocess
        version = importlib.metadata.version("habana-torch-plugin")
        listed = subprocess.run("pip list 2>/dev/null | grep habana-torch-plugin", shell=True, text=True,
                                capture_output=True).stdout.split()
        print(version, listed[-1], importlib.metadata.metadata("habana-torch-plugin")["Summary"].split()[0])
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    version, listed, summary = result.stdout.split()
    assert version == listed
    assert "emulated" in version and summary == "EMULATED"
    assert release_from_version(version) == EMULATED_RELEASE  # the metadata says the release the emulation follows


def test_habanas_own_package_wins_where_it_is_installed(tmp_path):
    """With a habana_frameworks on the path at start-up (here the test fake), neither the emulated package nor the
    emulated release's metadata is offered (the finder stays, for `lightning_habana` only)."""
    result = _python(
        f"""
        import importlib.metadata, sys
        import habana_frameworks
        try:
            version = importlib.metadata.version("habana-torch-plugin")
        except importlib.metadata.PackageNotFoundError:
            version = None
        print(habana_frameworks.__path__[0].startswith({FAKE_HABANA_SITE!r}), version,
              [f.find_spec(name) for f in sys.meta_path if type(f).__name__ == "HabanaFallbackFinder"
               for name in ("habana_frameworks", "intel_transformer_engine")])
        """,
        tmp_path,
        PYTHONPATH=FAKE_HABANA_SITE,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["True", "None", "[None,", "None]"]


def test_the_autoload_switch_leaves_habana_unfound(tmp_path):
    result = _python("import habana_frameworks.torch.core", tmp_path, HPU_NB_AUTOLOAD="0")
    assert result.returncode != 0
    assert "No module named 'habana_frameworks'" in result.stderr


def test_intel_transformer_engine_is_the_emulated_transformer_engine_by_name_and_distribution(tmp_path):
    """accelerate's fp8 check on HPU (optimum-habana's fp8=True) asks for the module and the distribution by name."""
    result = _python(
        """
        import importlib.metadata, importlib.util
        found = importlib.util.find_spec("intel_transformer_engine") is not None
        version = importlib.metadata.version("intel-transformer-engine")
        import intel_transformer_engine.recipe
        import habana_frameworks.torch.hpex.experimental.transformer_engine as te
        print(found, version, intel_transformer_engine.Linear is te.Linear,
              intel_transformer_engine.recipe.DelayedScaling is te.recipe.DelayedScaling)
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found, version, same_linear, same_recipe = result.stdout.split()
    assert (found, same_linear, same_recipe) == ("True", "True", "True")
    assert release_from_version(version) == EMULATED_RELEASE and "emulated" in version


def test_notebook_kernels_of_this_venv_find_its_pip_first():
    """optimum-habana runs `pip list | grep habana-torch-plugin` through the shell at import: in a kernel of a venv that
    is not activated, PATH would find another Python's pip (no such distribution: an IndexError at import). The kernel
    spec `make setup` installs puts the venv's bin first, keeping the rest of the user's PATH."""
    import json

    spec = Path(sys.prefix) / "share" / "jupyter" / "kernels" / "python3" / "kernel.json"
    if not spec.is_file():
        import pytest

        pytest.skip("no kernel spec in this environment (make setup installs one)")
    path = json.loads(spec.read_text())["env"]["PATH"]
    assert path.split(os.pathsep) == [str(Path(sys.executable).parent), "${PATH}"]  # jupyter_client fills ${PATH} in

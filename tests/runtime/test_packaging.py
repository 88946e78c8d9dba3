"""hpu_nb as users install it: the emulated device's build (no compiler, unwritable cache, a killed build), the
set-up's torch (CPU build, no CUDA planned), and a wheel installed into a fresh virtual environment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from hpu_nb.emulator.hpu_device import build

REPO = Path(__file__).resolve().parents[2]
FAKE_CXX = Path(__file__).resolve().parents[1] / "install_checks" / "fake_cxx.sh"


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty HPU_NB_CACHE_DIR and the stand-in compiler (FAKE_CXX_MODE says what it does)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("HPU_NB_CACHE_DIR", str(cache))
    monkeypatch.setenv("CXX", str(FAKE_CXX))
    monkeypatch.setenv("FAKE_CXX_DIR", str(tmp_path))
    return cache


def test_a_build_puts_the_library_in_the_cache_and_nothing_else(empty_cache: Path) -> None:
    built = build.build(quiet=True)
    assert built == empty_cache / build.library_name() == build.library_path()
    assert built.read_text() == "not a real library\n"
    assert sorted(p.name for p in empty_cache.iterdir()) == [".build.lock", built.name, build.record_path(built).name,
                                                              build.stamp_path(built).name]
    assert empty_cache.stat().st_mode & 0o777 == 0o700  # made private: code every `import torch` runs lives here


def test_a_failed_compile_says_why_and_leaves_nothing(empty_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_CXX_MODE", "fail")
    with pytest.raises(build.DeviceBuildError, match=r"(?s)failed .*exit 1.*fake failure"):
        build.build(quiet=True)
    assert [p.name for p in empty_cache.iterdir()] == [".build.lock"]
    assert not build.library_path().exists()


def test_without_a_compiler_the_error_says_what_to_install_and_that_the_rest_needs_none(
        empty_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CXX")
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    monkeypatch.setenv("PATH", str(empty_bin))
    with pytest.raises(build.DeviceBuildError) as err:
        build.build(quiet=True)
    message = str(err.value)
    for advice in ("apt-get install g++", "conda install -c conda-forge cxx-compiler", "on a Gaudi", "trace viewer"):
        assert advice in message
    assert not empty_cache.exists()  # nothing created before we know a build can happen


def test_an_unwritable_default_cache_falls_back_to_a_writable_folder_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where the cache directory would be: mkdir fails as on a read-only HOME")
    monkeypatch.delenv("HPU_NB_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    monkeypatch.setenv("CXX", str(FAKE_CXX))
    fallback = tmp_path / "fallback"
    fallback.mkdir(mode=0o700)
    monkeypatch.setattr(tempfile, "tempdir", str(fallback))
    built = build.build()
    assert built.parent.parent == fallback and built.parent.name.startswith(f"hpu_nb-cache-{os.geteuid()}-")
    assert built.parent.stat().st_mode & 0o777 == 0o700
    assert build.library_path() == built  # the next process finds it there
    note = capsys.readouterr().err
    assert f"{blocked / 'hpu_nb'} cannot be written" in note and "Set HPU_NB_CACHE_DIR" in note
    assert build.build() == built  # and does not build again


def test_an_unwritable_hpu_nb_cache_dir_is_an_error_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    monkeypatch.setenv("HPU_NB_CACHE_DIR", str(blocked / "cache"))
    monkeypatch.setenv("CXX", str(FAKE_CXX))
    with pytest.raises(build.DeviceBuildError, match=r"none could be written .*Set HPU_NB_CACHE_DIR to a writable"):
        build.build(quiet=True)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_killed_build_leaves_no_compiler_running_and_the_next_build_discards_its_folder(
        empty_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_CXX_MODE", "hang")
    builder = subprocess.Popen(
        [sys.executable, "-c", "from hpu_nb.emulator.hpu_device import build; build.build()"],
        cwd=REPO, stderr=subprocess.DEVNULL,
    )
    pid_files = [tmp_path / "driver.pid", tmp_path / "cc1plus.pid"]
    deadline = time.monotonic() + 120
    while not all(f.exists() and f.read_text().strip() for f in pid_files):
        assert builder.poll() is None and time.monotonic() < deadline, "the stand-in compiler never started"
        time.sleep(0.1)
    compilers = [int(f.read_text()) for f in pid_files]
    assert all(_alive(pid) for pid in compilers)
    builder.send_signal(signal.SIGKILL)  # no Python clean-up runs
    builder.wait()
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in compilers):
        assert time.monotonic() < deadline, "the compiler outlived the killed build"
        time.sleep(0.1)
    assert [p.name for p in empty_cache.glob(".partial-*")], "expected the killed build's folder to be left"
    assert not build.library_path().exists()

    monkeypatch.setenv("FAKE_CXX_MODE", "ok")
    built = build.build(quiet=True)
    assert sorted(p.name for p in empty_cache.iterdir()) == [".build.lock", built.name, build.record_path(built).name,
                                                              build.stamp_path(built).name]
    assert empty_cache.stat().st_mode & 0o777 == 0o700  # made private: code every `import torch` runs lives here


# -- the set-up's torch: the CPU build by name, no CUDA package planned ----------------------------------------------
def _cpu_torch_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("cpu_torch", REPO / ".ci" / "cpu_torch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _makefile_value(name: str) -> str:
    for line in (REPO / "Makefile").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.rstrip("?: ").removeprefix("export ").strip() == name and value:
            return value.strip()
    raise AssertionError(f"{name} is not set in the Makefile")


def test_the_cuda_check_recognizes_cuda_packages_in_a_pip_report() -> None:
    cuda_packages = _cpu_torch_module().cuda_packages

    def report(*dists: tuple[str, str]) -> dict:
        return {"install": [{"metadata": {"name": name, "version": version}} for name, version in dists]}

    assert cuda_packages(report(("torch", "2.13.0+cpu"), ("numpy", "2.1.0"), ("lightning", "2.6.0"))) == []
    assert cuda_packages(report(("torch", "2.13.0"), ("nvidia-cublas-cu12", "12.4.5.8"), ("triton", "3.1.0"))) == [
        "nvidia-cublas-cu12==12.4.5.8", "triton==3.1.0"]
    assert cuda_packages(report(("torch", "2.13.0+cu126"), ("cuda-bindings", "12.9.0"))) == [
        "torch==2.13.0+cu126", "cuda-bindings==12.9.0"]


@pytest.mark.parametrize(("layer", "brings"), [("optimum", "optimum-habana"), ("transformers", "accelerate")])
def test_the_setup_plans_torch_cpu_and_no_cuda_package(tmp_path: Path, layer: str, brings: str) -> None:
    """What `make setup` installs on a machine without a Gaudi, with each extra `make test` layers over it in an
    environment of its own (optimum-habana pins transformers 4, the transformers layer has 5), planned from scratch
    (pip --dry-run --ignore-installed): torch at the Makefile's version, a CPU build, and not one nvidia-* / cuda-* /
    triton package."""
    import json

    from tests.install_checks.fresh_venv import copy_tracked_files

    source = copy_tracked_files(tmp_path / "src")
    version, extras = _makefile_value("TORCH_VERSION"), _makefile_value("EXTRAS")
    report_path = tmp_path / "plan.json"
    done = subprocess.run([sys.executable, str(REPO / ".ci" / "cpu_torch.py"), version, "--plan", str(report_path),
                           "--no-build-isolation", f".[{extras},{layer}]"], cwd=source, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    planned = {item["metadata"]["name"].lower(): item["metadata"]["version"]
               for item in json.loads(report_path.read_text())["install"]}
    assert planned["torch"].split("+")[0] == version
    assert "+cu" not in planned["torch"]
    assert not [name for name in planned if name.startswith(("nvidia-", "cuda-", "triton"))]
    assert {"hpu_nb", "lightning", "deepspeed", brings} <= set(planned)  # all of it, not torch alone


# -- the wheel and the sdist, installed into a fresh venv ------------------------------------------------------------
SCRIPTS = Path(__file__).resolve().parents[1] / "install_checks"
BUILD_MESSAGES = ("building the emulated hpu device", "DeepSpeed compiles", "Building extension module")


def _version_in_source() -> str:
    import re

    (version,) = re.findall(r'^__version__ = "([^"]+)"$', (REPO / "hpu_nb" / "__init__.py").read_text(), re.M)
    return version


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(source copy, sdist, wheel built from that sdist)."""
    from tests.install_checks.fresh_venv import build_sdist_and_wheel, copy_tracked_files

    root = tmp_path_factory.mktemp("dists")
    source = copy_tracked_files(root / "src")
    return (source, *build_sdist_and_wheel(source, root / "dist"))


@pytest.fixture(scope="module")
def fresh_venv(dists: tuple[Path, Path, Path], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The wheel installed (not editable) into a new venv, an empty HPU_NB_CACHE_DIR, a work folder outside the repo."""
    from tests.install_checks.fresh_venv import make_venv, venv_env

    root = tmp_path_factory.mktemp("fresh")
    python = make_venv(root / "venv", dists[2])
    cache, work = root / "cache", root / "work"
    cache.mkdir()
    work.mkdir()
    # DeepSpeed's CPU Adam op: where `make setup` built it for these same packages (building it again costs minutes).
    env = venv_env(root / "venv", HPU_NB_CACHE_DIR=str(cache),
                   TORCH_EXTENSIONS_DIR=str(REPO / ".venv" / "torch_extensions"))
    return {"root": root, "venv": root / "venv", "python": python, "cache": cache, "work": work, "env": env}


def _run(venv: dict, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    done = subprocess.run([str(venv["python"]), *args], cwd=venv["work"], env=venv["env"], capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done


def test_wheel_and_sdist_carry_every_file_of_the_package(dists: tuple[Path, Path, Path]) -> None:
    import tarfile
    import zipfile
    from email.parser import Parser

    source, sdist, wheel = dists
    package_files = {str(p.relative_to(source)) for p in (source / "hpu_nb").rglob("*")
                     if p.is_file() and p.suffix != ".md"}  # every file but notes for developers
    top_level = {"_hpu_nb_autoload.py", "_hpu_nb_habana_finder.py", "hpu_nb-habana.pth"}
    assert "hpu_nb/emulator/hpu_device/hpu_device.cpp" in package_files
    with zipfile.ZipFile(wheel) as whl:
        in_wheel = set(whl.namelist())
        metadata = Parser().parsestr(whl.read(f"hpu_nb-{_version_in_source()}.dist-info/METADATA").decode())
    assert sorted((package_files | top_level) - in_wheel) == []
    with tarfile.open(sdist) as tar:
        in_sdist = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    assert sorted((package_files | top_level | {"setup.py", "pyproject.toml", "MANIFEST.in"}) - in_sdist) == []
    assert metadata["Version"] == _version_in_source()
    assert metadata["Requires-Python"] == ">=3.10"
    assert "Programming Language :: Python :: 3.11" in metadata.get_all("Classifier")


@pytest.mark.timeout(900)
def test_the_installed_wheel_builds_the_device_trains_on_hpu_and_runs_gaudi_code(fresh_venv: dict) -> None:
    """A new user's first steps with the wheel: nothing built yet, hpu_nb imported from the new venv."""
    import json

    venv = fresh_venv
    site = str(venv["venv"] / "lib")
    where = json.loads(_run(venv, "-c", "import importlib.metadata as m, json, hpu_nb; print(json.dumps("
                                        "[hpu_nb.__file__, hpu_nb.__version__, m.version('hpu_nb')]))").stdout)
    assert where[0].startswith(site) and where[1] == where[2] == _version_in_source()

    assert not any(venv["cache"].iterdir())
    trained = _run(venv, str(SCRIPTS / "train_on_hpu.py"))
    assert "building the emulated hpu device" in trained.stderr  # at first use, from the wheel's C++ source
    assert list(venv["cache"].glob("hpu_device-*.so"))
    result = json.loads(trained.stdout.strip().splitlines()[-1])
    assert result["hpu_nb"].startswith(site) and result["accelerator"] == "HPUAccelerator"
    assert result["devices"] == ["hpu:0"]
    assert result["losses"][-1] < 0.1 * result["losses"][0]

    gaudi = _run(venv, str(SCRIPTS / "habana_first_line.py"))
    result = json.loads(gaudi.stdout.strip().splitlines()[-1])
    assert result["habana_frameworks"].startswith(site) and result["hpu_nb"].startswith(site)
    assert result["device"] == "hpu:0"
    assert "building" not in gaudi.stderr

    (shown,) = json.loads(_run(venv, str(SCRIPTS / "hpu_info_magic.py")).stdout.strip().splitlines()[-1])
    assert shown.startswith("Emulated Gaudi on the CPU")


def test_the_installed_wheels_finder_serves_lightning_habana(fresh_venv: dict) -> None:
    """The wheel's `hpu_nb-habana.pth` finder (not .venv's editable one) gives `lightning_habana` from the new venv."""
    import json

    venv = fresh_venv
    site = str(venv["venv"] / "lib")
    found = json.loads(_run(venv, "-c", "import json, hpu_nb, lightning_habana, _hpu_nb_habana_finder as f;"
                                        " from lightning_habana.pytorch.accelerator import HPUAccelerator;"
                                        " print(json.dumps([f.__file__, HPUAccelerator is hpu_nb.HPUAccelerator,"
                                        " lightning_habana.__hpu_nb_names__]))").stdout)
    assert found[0].startswith(site) and found[1:] == [True, True]


def _snapshot(*folders: Path) -> dict[str, float]:
    """The files under `folders` and their mtimes (folders themselves change when another process loads an op: torch's
    extension loader puts a lock file in the op's folder while it checks the build, which compiles nothing)."""
    return {str(p): p.stat().st_mtime for folder in folders if folder.exists() for p in folder.rglob("*")
            if p.is_file()}


@pytest.mark.timeout(1200)
def test_after_binders_postbuild_the_tutorial_notebooks_compile_nothing(fresh_venv: dict) -> None:
    """binder/postBuild's build step run in the fresh venv, then notebooks 01 and 03 on its kernel: no cell builds the
    device or a DeepSpeed op (nothing new in the cache folders, no build message in any output)."""
    import json
    import shlex

    venv = fresh_venv
    (step,) = [line for line in (REPO / "binder" / "postBuild").read_text().splitlines()
               if "hpu_nb.emulator.hpu_device" in line]
    words = shlex.split(step)  # [NAME=value ...] python -m hpu_nb.emulator.hpu_device ...
    assignments = dict(w.split("=", 1) for w in words[:words.index("python")])
    _run({**venv, "env": {**venv["env"], **assignments}}, *words[words.index("python") + 1:], timeout=900)
    assert list(venv["cache"].glob("hpu_device-*.so"))
    _run(venv, "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3")

    folders = (venv["cache"], Path(venv["env"]["TORCH_EXTENSIONS_DIR"]))
    before = _snapshot(*folders)
    notebooks = [str(REPO / "notebooks" / name) for name in ("01_getting_started.ipynb", "03_distributed.ipynb")]
    outputs = json.loads(_run(venv, str(SCRIPTS / "run_notebooks.py"), str(venv["work"]), *notebooks,
                              timeout=1100).stdout.strip().splitlines()[-1])
    assert set(outputs) == {"01_getting_started.ipynb", "03_distributed.ipynb"}
    for name, text in outputs.items():
        assert not [m for m in BUILD_MESSAGES if m in text], f"{name} compiled something:\n{text[-3000:]}"
    assert _snapshot(*folders) == before


# -- on a Gaudi: installing hpu_nb keeps Habana's torch, DeepSpeed fork and software ---------------------------------
# What Intel's Gaudi containers have installed, by release (versions as Habana names its builds).
HABANA_STACKS = {
    "1.21.0": {"torch": "2.6.0+hpu.synapse.v1.21.0", "habana-torch-plugin": "1.21.0.555",
               "deepspeed": "0.16.1+hpu.synapse.v1.21.0", "lightning": "2.6.0"},
    "1.18.0": {"torch": "2.4.0a0+git74cd574", "habana-torch-plugin": "1.18.0.524",
               "deepspeed": "0.14.4+hpu.synapse.v1.18.0"},
}


@pytest.mark.parametrize("release", sorted(HABANA_STACKS))
def test_pip_install_on_a_gaudi_container_replaces_none_of_habanas_packages(
        release: str, dists: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """`pip install "hpu_nb[lab]"` (the wheel) into an environment holding Habana's packages (as distributions, as
    pip sees them): pip's dry run plans hpu_nb and the notebook packages, and none of Habana's."""
    import json

    venv = tmp_path / "gaudi-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True).stdout.strip())
    for name, version in HABANA_STACKS[release].items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "INSTALLER").write_text("habana\n")
    report = tmp_path / "plan.json"
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--dry-run", "--quiet",
                           "--report", str(report), f"{dists[2]}[lab]"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    planned = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert {"hpu-nb", "jupyterlab", "ipywidgets"} <= {name.replace("_", "-") for name in planned}
    assert planned & set(HABANA_STACKS[release]) == set()

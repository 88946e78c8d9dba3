"""Only what pyproject.toml cannot say: put `hpu_nb-habana.pth` at the root of site-packages.

That file runs at interpreter start and lets `import habana_frameworks` (a Gaudi program's usual first line) find the
emulated Gaudi where Habana's software is absent (see _hpu_nb_habana_finder.py). setuptools installs package files and
top-level modules, not a `.pth`, so build_py copies it into the build tree next to the top-level modules; wheels
(`pip install .`, `python -m build`) carry it from there; editable installs (`pip install -e .`) get it from the hook
below.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = "hpu_nb-habana.pth"


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / PTH
        target.parent.mkdir(parents=True, exist_ok=True)
        self.copy_file(str(Path(__file__).parent / PTH), str(target), preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib) / PTH)]


class EditableWheelWithPth(editable_wheel):
    """`pip install -e .` builds a wheel of links, not of build_py's files: put the `.pth` in it too. The hook is the
    step that fills the wheel's root folder (setuptools 69-84); tests/core/test_import.py fails if it stops running."""

    def _install_namespaces(self, installation_dir, pth_prefix):
        super()._install_namespaces(installation_dir, pth_prefix)
        self.copy_file(str(Path(__file__).parent / PTH), str(Path(installation_dir) / PTH), preserve_mode=False)


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})

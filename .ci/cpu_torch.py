"""Install (or plan) torch's CPU build by name, never a CUDA one: what `make setup` runs on a machine without a Gaudi.

    python .ci/cpu_torch.py VERSION [--plan REPORT.json] [PIP INSTALL ARGS...]

torch comes from PyTorch's CPU wheel index as `torch==VERSION+cpu` (as binder/requirements.txt names it). Where that
index cannot be reached (an offline mirror, a proxy that only lets PyPI through) it falls back to pip's configured
index with `torch==VERSION`, and refuses to install if pip would then plan any CUDA package (`nvidia-*`, `triton`,
`cuda-*`, a `+cu` torch). With --plan it installs nothing: it writes pip's dry-run report of a fresh install
(`--ignore-installed`) of torch plus the other arguments (e.g. `.[dev,deepspeed]`), prints what CUDA packages it plans
and exits 1 if there are any. Standard library only: it runs before anything else is installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import urllib.request

CPU_INDEX = os.environ.get("TORCH_CPU_INDEX", "https://download.pytorch.org/whl/cpu")
CUDA_NAMES = ("nvidia-", "cuda-", "triton")


def cpu_index_reachable(timeout: float = 10.0) -> bool:
    try:
        with urllib.request.urlopen(f"{CPU_INDEX.rstrip('/')}/torch/", timeout=timeout) as response:
            return response.status == 200
    except (OSError, ValueError):
        return False


def torch_requirement(version: str) -> list[str]:
    """torch's requirement and the index arguments that give its CPU build."""
    if cpu_index_reachable():
        return [f"torch=={version}+cpu", "--extra-index-url", CPU_INDEX]
    print(f"cpu_torch: PyTorch's CPU index ({CPU_INDEX}) is unreachable; torch=={version} comes from pip's configured"
          " index, checked below to be a CPU build.", file=sys.stderr)
    return [f"torch=={version}"]


def cuda_packages(report: dict) -> list[str]:
    """The planned installs that are CUDA: nvidia-* / cuda-* / triton, or a torch with a +cu local version."""
    found = []
    for item in report.get("install", []):
        name, version = item["metadata"]["name"].lower(), item["metadata"]["version"]
        if name.startswith(CUDA_NAMES) or (name == "torch" and "+cu" in version):
            found.append(f"{name}=={version}")
    return found


def plan(pip_args: list[str], report_path: str) -> list[str]:
    """Write pip's dry-run report of a fresh install of pip_args; the CUDA packages it plans."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", report_path,
         *pip_args],
        check=True,
    )
    with open(report_path) as f:
        return cuda_packages(json.load(f))


def main(argv: list[str]) -> int:
    version, rest = argv[0], argv[1:]
    report_path = None
    if rest[:1] == ["--plan"]:
        report_path, rest = rest[1], rest[2:]
    args = torch_requirement(version) + rest
    if report_path is not None or "+cpu" not in args[0]:
        with tempfile.TemporaryDirectory() as tmp:
            cuda = plan(args, report_path or os.path.join(tmp, "report.json"))
        if cuda:
            print(f"cpu_torch: pip would install CUDA packages ({', '.join(cuda)}): refusing. Point pip at a CPU build"
                  f" of torch (e.g. PIP_EXTRA_INDEX_URL={CPU_INDEX}).", file=sys.stderr)
            return 1
        print("cpu_torch: the plan has no CUDA package.", file=sys.stderr)
        if report_path is not None:
            return 0
    return subprocess.run([sys.executable, "-m", "pip", "install", *args]).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

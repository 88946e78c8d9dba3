"""A fake `hl-smi` executable: a small Python script that answers -v / -L / -Q like the real tool.

Modes: "normal" (realistic output for the configured cards), "missing" (not on PATH), "failing" (exit 1
with a driver error), "hanging" (sleeps `hang_s` seconds), "garbage" (exit 0 with unreadable output).
Each run appends its arguments to a log, so tests can see how often and how hl-smi was asked.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

MODES = ("normal", "missing", "failing", "hanging", "garbage")
PRODUCT_NAMES = {"gaudi": "HL-205", "gaudi2": "HL-225", "gaudi3": "HL-325L"}
MEMORY_MIB = {"gaudi": 32768, "gaudi2": 98304, "gaudi3": 131072}

_SCRIPT = """#!{python} -IS
import json, os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "hl-smi.json")) as f:
    cfg = json.load(f)
with open(cfg["log"], "a") as f:
    f.write(json.dumps({"argv": sys.argv[1:], "pid": os.getpid()}) + "\\n")
mode = cfg["mode"]
if mode == "failing":
    sys.stderr.write("hl-smi: HLML error: driver is not loaded (habanalabs), err -19\\n")
    sys.exit(1)
if mode == "hanging":
    time.sleep(cfg["hang_s"])
if mode == "garbage":
    sys.stdout.write("\\x1b[31m@@ 0xDEADBEEF ;; ##\\nSegmentation fault (core dumped) -- retry 1,2\\n")
    sys.exit(0)
flag = next((a for a in sys.argv[1:] if a in ("-v", "-L", "-Q")), "")
sys.stdout.write(cfg["outputs"].get(flag, cfg["outputs"][""]))
"""


class FakeHlSmi:
    """The fake hl-smi in `directory` (put that directory first on PATH to use it)."""

    def __init__(self, directory: Path, generation: str = "gaudi2", device_count: int = 8,
                 synapseai: str = "1.17.2", firmware: str = "51.5.1", driver: str = "1.17.2-4ab2e36",
                 hang_s: float = 30.0) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.script = self.directory / "hl-smi"
        self.log = self.directory / "hl-smi.calls"
        self.generation, self.device_count = generation, device_count
        self.synapseai, self.firmware, self.driver = synapseai, firmware, driver
        self.hang_s = hang_s
        self.memory_used_mib = [768] * device_count
        self._mode = "normal"
        self.write()

    # -- configuration ---------------------------------------------------------------------------------------
    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"Unknown fake hl-smi mode {mode!r}; choose one of: {', '.join(MODES)}")
        self._mode = mode
        self.write()

    def write(self) -> None:
        """(Re)write the script and its configuration for the current mode and numbers."""
        config = {"mode": self._mode, "hang_s": self.hang_s, "log": str(self.log), "outputs": self.outputs()}
        (self.directory / "hl-smi.json").write_text(json.dumps(config))
        if self._mode == "missing":
            self.script.unlink(missing_ok=True)
        else:
            self.script.write_text(_SCRIPT.replace("{python}", sys.executable))
            self.script.chmod(0o755)

    def invocations(self) -> list[list[str]]:
        """The argument lists hl-smi was run with, in order."""
        return [entry["argv"] for entry in self._log_entries()]

    def pids(self) -> list[int]:
        """The process id of each run (to check that a hanging run was really stopped)."""
        return [entry["pid"] for entry in self._log_entries()]

    def _log_entries(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    # -- what the real tool would print ----------------------------------------------------------------------
    def outputs(self) -> dict[str, str]:
        return {"-v": self.version_text(), "-L": self.listing_text(), "-Q": self.query_text(), "": self.table_text()}

    def fw_tag(self) -> str:
        return f"hl-{self.generation}-{self.synapseai}-fw-{self.firmware}-sec-9"

    def version_text(self) -> str:
        return f"Habanalabs hl-smi/hlml version hl-{self.synapseai}-fw-{self.firmware}.0 (Aug 04 2024 - 02:48:21)\n"

    def listing_text(self) -> str:
        product, total = PRODUCT_NAMES[self.generation], MEMORY_MIB[self.generation]
        lines = [
            "", "================ HL-SMI LOG ================", "",
            f"{'Timestamp':<40}: Thu Nov 16 04:54:24 UTC 2024",
            f"{'Driver Version':<40}: {self.driver}",
            f"{'HL-SMI Version':<40}: hl-{self.synapseai}-fw-{self.firmware}.0 (Aug 04 2024 - 02:48:21)", "",
            f"{'Attached AIPs':<40}: {self.device_count}", "",
        ]
        for i in range(self.device_count):
            bus = f"0000:{0x19 + i:02x}:00.0"
            lines += [
                f"[{i}] AIP (accel{i}) {bus}",
                f"        {'Product Name':<32}: {product}",
                f"        {'Serial Number':<32}: AM5001{6138 + i}",
                f"        {'Module ID':<32}: {i}",
                f"        {'Firmware [SPI] Version':<32}: Preboot version {self.fw_tag()} (Oct 12 2024 - 22:14:34)",
                f"        {'Firmware [OS] Version':<32}: Zephyr 2.7.2-{self.fw_tag()} (Oct 12 2024 - 22:14:47)",
                "        PCI",
                f"                {'Bus Id':<24}: {bus}",
                "        Memory Usage",
                f"                {'Total':<24}: {total} MB",
                f"                {'Used':<24}: {self.memory_used_mib[i]} MB",
                f"                {'Free':<24}: {total - self.memory_used_mib[i]} MB",
            ]
        return "\n".join(lines) + "\n"

    def query_text(self) -> str:
        product, total = PRODUCT_NAMES[self.generation], MEMORY_MIB[self.generation]
        rows = [f"{i}, {product}, {total}, {self.memory_used_mib[i]}, {i % 3}, {28 + i}, {84 + i}"
                for i in range(self.device_count)]
        return "\n".join(rows) + "\n"

    def table_text(self) -> str:
        return (f"| HL-SMI Version:       hl-{self.synapseai}-fw-{self.firmware}.0 |\n"
                f"| Driver Version:       {self.driver} |\n")


@contextlib.contextmanager
def fake_hlsmi_on_path(directory: Path, mode: str = "normal", **options: object) -> Iterator[FakeHlSmi]:
    """Put a fake hl-smi first on PATH (restored afterwards)."""
    tool = FakeHlSmi(directory, **options)  # type: ignore[arg-type]
    tool.mode = mode
    saved = os.environ.get("PATH", "")
    os.environ["PATH"] = str(tool.directory) + os.pathsep + saved
    try:
        yield tool
    finally:
        os.environ["PATH"] = saved

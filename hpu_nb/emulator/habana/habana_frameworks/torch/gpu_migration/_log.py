"""The migration log: every call the toolkit migrates, written where Habana's toolkit writes it, in its format.

Behaviour modelled (Habana's toolkit, `gpu_migration/__init__.py` configure_logger and `core/logger.py`; the format as
the logs shipped with Habana's Model-References GPU-migration examples show it):
- Off unless GPU_MIGRATION_LOG_LEVEL is set. Set to anything, it opens
  `$HABANA_LOGS/gpu_migration_logs/<YYYY-MM-DD>/<HH-MM-SS>/gpu_migration_<pid>.log` (or `./gpu_migration_logs/...`
  without HABANA_LOGS) and prints `gpu migration log will be saved to <path>`. Levels "1", "2" and "3" record calls;
  any other value leaves the file empty. "1" also echoes each record to stdout and records the calls torch makes
  from its own code (torch.manual_seed calling torch.cuda.manual_seed_all, Module.to calling Tensor.to); "2" and "3"
  record only calls from outside torch.
- A record is `[<time>] <file>:<line>`, then `    [context]: <that source line>`, then
  `    [<hpu_match|hpu_modified|hpu_mismatch>]: <api>(<name>=<value>, ...) --> <what ran instead>` and a blank line.
  The same record from the same line is written once (a training loop does not repeat it every step).
"""

from __future__ import annotations

import linecache
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import torch

HPU_MATCH = "hpu_match"  # the call maps to Habana's equivalent
HPU_MODIFIED = "hpu_modified"  # it runs, changed (another value, another argument)
HPU_MISMATCH = "hpu_mismatch"  # no Gaudi equivalent: it does nothing, or refuses

LEVEL_ENV = "GPU_MIGRATION_LOG_LEVEL"
_COLORS = {HPU_MATCH: "\033[92m", HPU_MODIFIED: "\033[93m", HPU_MISMATCH: "\033[94m"}
_PACKAGE_DIR = str(Path(__file__).resolve().parent)
# torch's folder as its frames name it (a virtual environment reached through a symbolic link) and resolved
_TORCH_DIRS = tuple({str(Path(torch.__file__).parent), str(Path(torch.__file__).resolve().parent)})


def format_args(args: dict[str, Any] | None) -> str:
    """`name=value, ` for each argument, as the toolkit writes a call's arguments (trailing separator included)."""
    return "".join(f"{name}={value}, " for name, value in (args or {}).items())


class MigrationLog:
    def __init__(self) -> None:
        self.level: str | None = None
        self.path: Path | None = None
        self._file: IO[str] | None = None
        self._written: set[tuple[str, int, str]] = set()

    def configure(self, environ: os._Environ[str] | dict[str, str]) -> None:
        level = environ.get(LEVEL_ENV)
        if level is None:
            return
        self.level = level
        base = Path(environ["HABANA_LOGS"]) if environ.get("HABANA_LOGS") is not None else Path.cwd()
        now = datetime.now()
        directory = base / "gpu_migration_logs" / now.strftime("%Y-%m-%d") / now.strftime("%H-%M-%S")
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"gpu_migration_{os.getpid()}.log"
        print(f"gpu migration log will be saved to {self.path}")
        self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 -- open for the process's life, as Habana's

    @property
    def recording(self) -> bool:
        return self._file is not None and self.level in ("1", "2", "3")

    def record(self, api_type: str, api: str, args: dict[str, Any] | None, new_call: str) -> None:
        """Log one migrated call `api(args)` that ran as `new_call`, at the user's line that made it."""
        if not self.recording:
            return
        caller = self._caller()
        if caller is None:
            return
        filename, lineno = caller
        message = f"[{api_type}]: {api}({format_args(args)}) --> {new_call}"
        if (filename, lineno, message) in self._written:
            return
        self._written.add((filename, lineno, message))
        context = linecache.getline(filename, lineno) or "\n"
        where = f"[{datetime.now():%Y-%m-%d %H:%M:%S}] {filename}:{lineno}\n    [context]: {context}"
        what = f"    {message}\n"
        assert self._file is not None
        self._file.write(where + what + "\n")
        self._file.flush()
        if self.level == "1":
            print(where)
            print(_COLORS[api_type] + what + "\033[0m")

    def _caller(self) -> tuple[str, int] | None:
        """The first frame outside this package; None when it is torch's own code and the level leaves those out."""
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
            frame = frame.f_back  # type: ignore[assignment]
        if frame is None:
            return None
        filename = frame.f_code.co_filename
        if self.level != "1" and filename.startswith(_TORCH_DIRS):
            return None
        return filename, frame.f_lineno


LOG = MigrationLog()

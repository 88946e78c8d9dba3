"""The log the emulated Gaudi's fp8 inference keeps where Intel Neural Compressor keeps its own: `inc_log.txt`.

On a Gaudi, INC's fp8 code (`neural_compressor/torch/algorithms/fp8_quant/utils/logger.py`) logs to the "INC" logger
into `$HABANA_LOGS[/<HLS_ID>][/<ID>]/inc_log.txt` (HABANA_LOGS unset: `~/.habana_logs`, or `/tmp/.habana_logs` without
HOME), appending, rotated at INC_LOG_FILE_SIZE bytes (10 MiB) into INC_LOG_FILE_AMOUNT backups (5), at the level
LOG_LEVEL_INC / LOG_LEVEL_ALL names ("0" trace ... "6" off; info by default), and each measure or quantize step writes
its configuration and module count there at info level. Gaudi users (and lightning-habana's tests) look for that file;
the emulated engine writes the same kind of lines, each saying it is the emulation. Written here, not taken from INC:
INC is not installed with hpu_nb, and its logger module patches the `logging` package on import.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import Any

LOGGER_NAME = "INC"
FILE_NAME = "inc_log.txt"
DEFAULT_FILE_SIZE = 10 * 1024 * 1024
DEFAULT_FILE_AMOUNT = 5
# INC's LOG_LEVEL_INC values: "0" is its TRACE (5), "6" turns the logger off
LEVELS = {"0": 5, "1": logging.DEBUG, "2": logging.INFO, "3": logging.WARNING, "4": logging.ERROR,
          "5": logging.CRITICAL, "6": None}
EMULATED = "hpu_nb emulated Gaudi (INC-style fp8, not Intel Neural Compressor)"

_logger: logging.Logger | None = None


def log_folder() -> Path:
    """INC's folder rule: HABANA_LOGS (else ~/.habana_logs, else /tmp/.habana_logs), then HLS_ID and ID if set."""
    root = os.environ.get("HABANA_LOGS")
    if root is None:
        home = os.environ.get("HOME")
        root = "/tmp/.habana_logs" if home is None else f"{home}/.habana_logs"
    folder = Path(root)
    for variable in ("HLS_ID", "ID"):
        value = os.environ.get(variable, "").strip()
        if value.lstrip("-").isdigit() and int(value) >= 0:
            folder = folder / str(int(value))
    return folder


def _positive_int(variable: str, default: int) -> int:
    value = os.environ.get(variable, "").strip()
    return int(value) if value.isdigit() else default


def inc_logger() -> logging.Logger:
    """The "INC" logger with INC's file handler, made once per process as INC's singleton is. A folder that cannot be
    made disables it with one printed line, as INC does; an unknown LOG_LEVEL_INC is an error naming it, as INC's."""
    global _logger
    if _logger is not None:
        return _logger
    logger = logging.getLogger(LOGGER_NAME)
    level_name = os.environ.get("LOG_LEVEL_INC", os.environ.get("LOG_LEVEL_ALL"))
    if level_name is not None and level_name not in LEVELS:
        raise ValueError(f"Wrong Log Level value: '{level_name}'. Must be an integer 0-6 (LOG_LEVEL_INC).")
    level = logging.INFO if level_name is None else LEVELS[level_name]
    logger.handlers.clear()
    logger.propagate = False
    logger.disabled = level is None
    if level is not None:
        logger.setLevel(level)
        folder = log_folder()
        try:
            folder.mkdir(parents=True, exist_ok=True)
            handler = RotatingFileHandler(folder / FILE_NAME, maxBytes=_positive_int("INC_LOG_FILE_SIZE",
                                                                                      DEFAULT_FILE_SIZE),
                                          backupCount=_positive_int("INC_LOG_FILE_AMOUNT", DEFAULT_FILE_AMOUNT))
        except OSError as error:
            print(f"Warning: Directory '{folder}' can not be created for INC logs: {error.strerror}. Logger is "
                  "disabled.")
            logger.disabled = True
        else:
            handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] %(message)s",
                                                  "%Y-%m-%d %H:%M:%S"))
            logger.addHandler(handler)
    _logger = logger
    return logger


def log_step(step: str, config: Mapping[str, Any], modules: int) -> None:
    """One measure or quantize step, as INC logs it: the configuration and the number of modules it patches."""
    logger = inc_logger()
    logger.info("%s: %s", EMULATED, step)
    logger.info("neural_compressor_pt Configuration = %s", dict(config))
    logger.info("Total modules : %d", modules)


def reset() -> None:
    """Forget the logger (tests, and a changed HABANA_LOGS): the next step makes it again."""
    global _logger
    if _logger is not None:
        for handler in list(_logger.handlers):
            handler.close()
            _logger.removeHandler(handler)
    _logger = None

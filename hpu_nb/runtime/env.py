"""The environment variables that change what hpu_nb or the Habana stack does, and what each means."""

from __future__ import annotations

import os
import re
from pathlib import Path

# name -> what it does; shown by %hpu_info next to the current value.
FLAGS: dict[str, str] = {
    "HPU_NB_BACKEND": "hpu_nb: auto | gaudi | emulated (which device backend to use)",
    "HPU_NB_DEVICE": "hpu_nb: gaudi | gaudi2 | gaudi3 (the generation the emulated Gaudi pretends to be)",
    "HPU_NB_DEVICE_COUNT": "hpu_nb: how many emulated cards exist (default 8; devices='auto' uses 1 unless set)",
    "HPU_NB_CACHE_DIR": "hpu_nb: where the emulated device's library and fp8 measurements are cached (default"
    " ~/.cache/hpu_nb; code is read from it only when no other user can write it)",
    "HPU_NB_SHARED_LIBRARY": "hpu_nb: a prebuilt emulated-device library a team shares (file or folder), used read-only"
    " through a private copy checked against HPU_NB_SHARED_LIBRARY_SHA256",
    "HPU_NB_SHARED_LIBRARY_SHA256": "hpu_nb: the SHA-256 the team published for HPU_NB_SHARED_LIBRARY (comma-separated"
    " for several)",
    "HPU_NB_MEMORY_LIMIT": "hpu_nb: memory Limit of each emulated card, e.g. 512MiB or 2GiB",
    "PT_HPU_LAZY_MODE": "0 eager / torch.compile (default since Gaudi software 1.21); 1 lazy graph mode (legacy)",
    "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST": "file of ATen op names that autocast runs in bf16/fp16 (replaces the"
    " default list; read at process start)",
    "PT_HPU_AUTOCAST_FP32_OPS_LIST": "file of ATen op names autocast keeps in fp32 (replaces the default list; read at"
    " process start)",
    "LOWER_LIST": "old name of PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST (not read by Gaudi software 1.19+)",
    "FP32_LIST": "old name of PT_HPU_AUTOCAST_FP32_OPS_LIST (not read by Gaudi software 1.19+)",
    "HABANA_VISIBLE_MODULES": "which cards this process may use (multi-tenancy)",
    "HLS_MODULE_ID": "the card this process acquires (set per local rank by Habana's HCCL when several run)",
    "PT_HPU_AUTOLOAD": "0 / 1: whether `import torch` loads Habana's software (on by default in eager mode, 1.18+)",
    "PT_HPU_ENABLE_CACHE_METRICS": "1: collect the recipe_cache metric (metrics.metric_global)",
    "PT_HPU_RECIPE_CACHE_CONFIG": "<dir>,<delete:true/false>,<MB>: graph recipe cache",
    "PT_HPU_ENABLE_REFINE_DYNAMIC_SHAPES": "dynamic-shape handling",
    "PT_ENABLE_INT64_SUPPORT": "native int64 (Gaudi2)",
    "HABANA_LOGS": "default directory for logs and fp8 measurement dumps",
    "QUANT_CONFIG": "HQT / INC fp8 quantization config JSON",
    "HABANA_PROFILE": "must be unset or profile_api_light with the PyTorch profiler",
    "DEEPSPEED_USE_HPU": "set for DeepSpeed on HPU",
    "PT_HPU_LAZY_ACC_PAR_MODE": "set to 0 for DeepSpeed on HPU",
}


def flag_values() -> dict[str, str | None]:
    """Current value of every flag in FLAGS (None when unset)."""
    return {name: os.environ.get(name) for name in FLAGS}


# Habana's boolean switches read "1", "y", "yes", "t", "true" or "on" (any case) as on, anything else as off.
_TRUE = ("1", "y", "yes", "t", "true", "on")


def is_true(value: str | None) -> bool:
    """A Habana boolean environment value, read as Habana's software reads it (unset is off)."""
    return (value or "").strip().lower() in _TRUE


DYNAMIC_SHAPES_ENV = "PT_HPU_ENABLE_REFINE_DYNAMIC_SHAPES"  # torch.compile's dynamic shapes on hpu (off by default)

CACHE_ENV = "HPU_NB_CACHE_DIR"


def cache_dir() -> Path:
    """hpu_nb's cache directory (the emulated device's library, fp8 measurements): $HPU_NB_CACHE_DIR, else
    $XDG_CACHE_HOME/hpu_nb, else ~/.cache/hpu_nb."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hpu_nb"


VISIBLE_MODULES_ENV = "HABANA_VISIBLE_MODULES"


def visible_modules() -> list[str]:
    """The card (module) ids listed in HABANA_VISIBLE_MODULES, e.g. "0,1,2,3" -> ["0", "1", "2", "3"]."""
    return [m.strip() for m in os.environ.get(VISIBLE_MODULES_ENV, "").split(",") if m.strip()]


LAZY_MODE_ENV = "PT_HPU_LAZY_MODE"


def lazy_mode_from_env(default: bool) -> bool:
    """PT_HPU_LAZY_MODE read as Habana's software reads it: "0" eager, "1" lazy, unset the release's default.

    Anything else is an error naming the variable: Habana's HCCL module does `int(PT_HPU_LAZY_MODE)` and other parts
    only compare with "0", so "false" or "2" would mean different things in different places on a Gaudi.
    """
    value = os.environ.get(LAZY_MODE_ENV)
    if value is None or not value.strip():
        return default
    if value.strip() in ("0", "1"):
        return value.strip() == "1"
    raise ValueError(
        f"{LAZY_MODE_ENV}={value!r} is not a Gaudi execution mode: set 0 (eager with torch.compile, the default since"
        " Gaudi software 1.21) or 1 (lazy mode, legacy), or unset it."
    )


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 1000**2, "mb": 1000**2, "mib": 1 << 20,
          "g": 1000**3, "gb": 1000**3, "gib": 1 << 30, "t": 1000**4, "tb": 1000**4, "tib": 1 << 40}


def parse_size(text: str) -> int:
    """Parse '512MiB', '2GiB', '1.5 GB' or a plain byte count into bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise ValueError(
            f"Cannot read memory size {text!r}: write a number with an optional unit, e.g. 512MiB, 2GiB, 1.5GB or"
            " 1048576."
        )
    size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"Memory size must be positive, got {text!r}.")
    return size


def format_bytes(n: float) -> str:
    """1536 -> '1.50 KiB' (binary units, as Gaudi tools report)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")

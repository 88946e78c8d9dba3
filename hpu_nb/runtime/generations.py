"""Which Gaudi can do what: generations (capacity, fp16 / fp8) and software releases (defaults, variable names).

The one home for these rules: the accelerator, the precision plugin, fp8, op lists, %hpu_info and the fakes all ask
here rather than writing their own `if generation == ...`. Release facts are modelled on Habana's published bridge
source (github.com/HabanaAI/gaudi-pytorch-bridge, tag "Publish 1.19.0") and Habana's release notes.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from hpu_nb.runtime.env import LAZY_MODE_ENV

GiB = 1 << 30
FP8_E5M2_MAX = 57344.0  # e5m2's largest value, on every Gaudi with fp8
FP8_E4M3_DEFAULT_BIAS, FP8_E5M2_DEFAULT_BIAS = 7, 15  # 2**(exponent bits - 1) - 1


@dataclass(frozen=True)
class Generation:
    """One Gaudi generation: what a device of this kind can hold and compute."""

    key: str  # "gaudi", "gaudi2", "gaudi3": the value of HPU_NB_DEVICE
    device_name: str  # what habana_frameworks' get_device_name() reports
    hbm_bytes: int
    supports_fp16: bool
    supports_fp8: bool
    syn_device_type: str  # its member of habana_frameworks.torch.utils.experimental.synDeviceType
    board_prefix: str  # how its boards' product names start (hl-smi): HL-205 Gaudi, HL-225 Gaudi2, HL-325 Gaudi3
    # The largest e4m3 value this card represents (0: no fp8). Gaudi2's e4m3 is the "fnuz" variant, whose range ends at
    # 240 (INC's fp_utils.get_fullscale uses torch.float8_e4m3fnuz's range for float8_e4m3fn on Gaudi2); Gaudi3's is
    # torch.float8_e4m3fn's, 448. e5m2 is the same everywhere (FP8_E5M2_MAX).
    fp8_e4m3_max: float = 0.0
    # The hardware-aligned fp8 scales: the exponent biases the card's fp8 casts take (each scales by a power of two
    # for free), as Intel Neural Compressor lists them (fp8_quant/_core/fp_utils.py EXP_BIAS_SETS): Gaudi2's e4m3 casts
    # take 4 biases (3, 7, 11, 15: scales 16, 1, 1/16, 1/256), its e5m2 only the default 15; Gaudi3's take 0-62.
    fp8_exponent_biases: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())  # (E4M3, E5M2)
    # What a planner needs (hpu_nb.plan): published peaks, never measured here. See PLANNER_FACTS_SOURCE.
    hbm_bandwidth_bytes_per_s: float = 0.0  # peak HBM bandwidth
    peak_flops_bf16: float = 0.0  # dense bf16 matrix (MME) FLOP/s
    peak_flops_fp8: float = 0.0  # dense fp8 matrix FLOP/s (0: no fp8)
    nic_bytes_per_s: float = 0.0  # the card's embedded RoCE NICs, one direction (half the bidirectional figure)

    def peak_flops(self, precision: str) -> float:
        """The published dense matrix peak (FLOP/s) a precision runs its matmuls at: fp8 for "fp8", bf16 otherwise
        ("32-true" matmuls run on the MME in bf16/tf32-class throughput at best; the plan says it is an upper bound)."""
        if precision == "fp8" and self.peak_flops_fp8:
            return self.peak_flops_fp8
        return self.peak_flops_bf16

    @property
    def label(self) -> str:
        """How users name it: "Gaudi2"."""
        return self.key.capitalize()

    def fp16_support(self) -> tuple[bool, str]:
        """(available, reason): fp16 needs Gaudi2 or newer."""
        return _support(self.supports_fp16, "fp16", self.device_name)

    def fp8_support(self) -> tuple[bool, str]:
        """(available, reason): fp8 (training and inference) needs Gaudi2 or newer."""
        return _support(self.supports_fp8, "fp8", self.device_name)

    def fp8_max(self, fmt: str) -> float:
        """The largest value of fp8 format `fmt` ("E4M3" or "E5M2") on this card: the full scale fp8 scales aim at."""
        if not self.supports_fp8:
            raise ValueError(self.fp8_support()[1])
        if fmt.upper() not in ("E4M3", "E5M2"):
            raise ValueError(f"{fmt!r} is not a Gaudi fp8 format: use 'E4M3' or 'E5M2'.")
        return self.fp8_e4m3_max if fmt.upper() == "E4M3" else FP8_E5M2_MAX

    def fp8_hw_scales(self, fmt: str) -> tuple[float, ...]:
        """The hardware-aligned scales of fp8 format `fmt` on this card, largest first, as INC's divisors (x / scale
        is cast): 2**(default bias - bias) for each exponent bias the card's casts take (INC's
        get_fp8_hw_alligned_scales: each bias's full scale over the default's)."""
        self.fp8_max(fmt)  # refuses a card without fp8 and an unknown format
        e4m3 = fmt.upper() == "E4M3"
        default_bias = FP8_E4M3_DEFAULT_BIAS if e4m3 else FP8_E5M2_DEFAULT_BIAS
        return tuple(2.0 ** (default_bias - bias) for bias in self.fp8_exponent_biases[0 if e4m3 else 1])


def first_supporting(what: str) -> Generation:
    """The first generation with `what` ("fp16" or "fp8"): what "needs Gaudi2 or newer" and the form's labels say."""
    return next(gen for gen in GENERATIONS.values() if getattr(gen, f"supports_{what}"))


def _support(flag: bool, what: str, device_name: str) -> tuple[bool, str]:
    if flag:
        return True, ""
    return False, f"{what} is not supported on {device_name}: it needs {first_supporting(what).label} or newer."


# The planner's facts, each from Intel's own publications:
# - HBM capacity, peak HBM bandwidth, peak dense bf16 matrix TFLOPS and embedded NIC bandwidth (bidirectional) of all
#   three generations: Intel's Hot Chips 2024 talk "Intel Gaudi 3 AI Accelerator: Architected for Gen AI Training and
#   Inference" (R. Kaplan, August 2024), table "Gaudi Product Generations": Gaudi 60 TFLOPS / 32 GB / 900 GB/s /
#   2 Tb/s, Gaudi 2 432 TFLOPS / 96 GB / 2.46 TB/s / 4.8 Tb/s, Gaudi 3 1835 TFLOPS / 128 GB / 3.67 TB/s / 9.6 Tb/s.
# - fp8: Gaudi 3 1835 TFLOPS (same talk, "Intel Gaudi 3 Spec"); Gaudi 2 865 TFLOPS (Intel Gaudi 2 product brief /
#   Intel Vision 2024 comparison); first-generation Gaudi has no fp8.
# - Allocator granularity: Habana publishes none (the bridge's pool allocator is not documented); the plan counts
#   exact tensor bytes, as the emulated card's counters do, and says that a Gaudi's allocator may round up.
PLANNER_FACTS_SOURCE = ("Intel, Hot Chips 2024, 'Intel Gaudi 3 AI Accelerator: Architected for Gen AI Training and "
                        "Inference' (Gaudi product generations table); Gaudi 2 fp8: Intel Gaudi 2 product brief")
ALLOCATOR_GRANULARITY_BYTES: int | None = None  # not published by Habana: exact bytes planned, said in the output
TB = 10**12

GENERATIONS: dict[str, Generation] = {
    "gaudi": Generation("gaudi", "GAUDI", 32 * GiB, supports_fp16=False, supports_fp8=False,
                         syn_device_type="synDeviceGaudi", board_prefix="HL-20",
                         hbm_bandwidth_bytes_per_s=0.9 * TB, peak_flops_bf16=60 * TB, nic_bytes_per_s=2e12 / 8 / 2),
    "gaudi2": Generation("gaudi2", "GAUDI2", 96 * GiB, supports_fp16=True, supports_fp8=True,
                          syn_device_type="synDeviceGaudi2", board_prefix="HL-22", fp8_e4m3_max=240.0,
                          fp8_exponent_biases=((3, 7, 11, 15), (15,)),
                          hbm_bandwidth_bytes_per_s=2.46 * TB, peak_flops_bf16=432 * TB, peak_flops_fp8=865 * TB,
                          nic_bytes_per_s=4.8e12 / 8 / 2),
    "gaudi3": Generation("gaudi3", "GAUDI3", 128 * GiB, supports_fp16=True, supports_fp8=True,
                          syn_device_type="synDeviceGaudi3", board_prefix="HL-3", fp8_e4m3_max=448.0,
                          fp8_exponent_biases=(tuple(range(63)), tuple(range(63))),
                          hbm_bandwidth_bytes_per_s=3.67 * TB, peak_flops_bf16=1835 * TB, peak_flops_fp8=1835 * TB,
                          nic_bytes_per_s=9.6e12 / 8 / 2),
}


def generation_from_name(name: str) -> Generation:
    """Map a key ("gaudi2"), a device name ("GAUDI2", "GAUDI2B", "GAUDI 3") or a board ("HL-225") to its generation."""
    text = name.strip().lower().replace(" ", "").replace("-", "")
    if text in GENERATIONS:
        return GENERATIONS[text]
    for key in sorted(GENERATIONS, key=len, reverse=True):  # "gaudi2b" is a gaudi2, not a first-generation gaudi
        if text.startswith(key):
            return GENERATIONS[key]
    board = generation_of_board(name)
    if board is not None:
        return board
    raise ValueError(f"Unknown Gaudi generation {name!r}; choose one of: {', '.join(GENERATIONS)}.")


def generation_of_board(product_name: str) -> Generation | None:
    """'HL-225' -> Gaudi2: a board's product name (hl-smi) tells its generation; None for a name no generation has."""
    name = product_name.strip().upper().replace(" ", "")
    if not name.startswith("HL-") and name.startswith("HL"):
        name = "HL-" + name[2:]
    for gen in sorted(GENERATIONS.values(), key=lambda gen: len(gen.board_prefix), reverse=True):
        if name.startswith(gen.board_prefix):
            return gen
    return None


# -- software releases -------------------------------------------------------------------------------------------
LOWER_LIST_ENV = "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST"
FP32_LIST_ENV = "PT_HPU_AUTOCAST_FP32_OPS_LIST"
OLD_LOWER_LIST_ENV = "LOWER_LIST"
OLD_FP32_LIST_ENV = "FP32_LIST"
AUTOLOAD_ENV = "PT_HPU_AUTOLOAD"


@dataclass(frozen=True, order=True)
class Release:
    """A Gaudi software (SynapseAI / habana-torch-plugin) release, by (major, minor), and what changed with it."""

    major: int
    minor: int

    @property
    def lazy_by_default(self) -> bool:
        """Up to 1.20 PT_HPU_LAZY_MODE defaults to "1"; from 1.21 eager + torch.compile is the default."""
        return (self.major, self.minor) < (1, 21)

    def autoloads(self, environ: dict[str, str] | os._Environ[str]) -> bool:
        """Whether `import torch` imports habana_frameworks (core, hpu, hccl): from 1.18, in eager mode unless
        PT_HPU_AUTOLOAD says "0" / "1" (Habana's habana_frameworks/autoload)."""
        if (self.major, self.minor) < (1, 18):
            return False
        asked = environ.get(AUTOLOAD_ENV, "").strip()
        if asked in ("0", "1"):
            return asked == "1"
        lazy = environ.get(LAZY_MODE_ENV, "").strip() or ("1" if self.lazy_by_default else "0")
        return lazy != "1"

    @property
    def op_list_envs(self) -> tuple[str, str]:
        """(lower-precision, fp32) op-list variables this release reads: renamed in 1.19."""
        if (self.major, self.minor) >= (1, 19):
            return LOWER_LIST_ENV, FP32_LIST_ENV
        return OLD_LOWER_LIST_ENV, OLD_FP32_LIST_ENV

    def ignored_op_list_envs(self, environ: dict[str, str] | os._Environ[str]) -> list[tuple[str, str]]:
        """(old, new) for each old op-list variable set in `environ` that this release does not read."""
        if self.op_list_envs == (OLD_LOWER_LIST_ENV, OLD_FP32_LIST_ENV):
            return []
        pairs = ((OLD_LOWER_LIST_ENV, LOWER_LIST_ENV), (OLD_FP32_LIST_ENV, FP32_LIST_ENV))
        return [(old, new) for old, new in pairs if environ.get(old) and not environ.get(new)]

    def supports(self, generation: Generation) -> tuple[bool, str]:
        """(supported, reason): 1.22 and newer dropped first-generation Gaudi."""
        if generation.key == "gaudi" and (self.major, self.minor) >= (1, 22):
            return False, (f"Gaudi software {self} no longer supports first-generation Gaudi (GAUDI); "
                           "the last release that does is 1.21")
        return True, ""

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


def release_from_version(version: str) -> Release:
    """'1.21.0.555' / '1.18.0-524' / '1.19' -> Release(1, 21)."""
    match = re.match(r"\s*(\d+)\.(\d+)", str(version))
    if match is None:
        raise ValueError(f"{version!r} is not a Gaudi software version (expected e.g. '1.21.0').")
    return Release(int(match.group(1)), int(match.group(2)))


def zero3_support(generation: Generation, release: Release | None) -> tuple[bool, str]:
    """(supported, reason): DeepSpeed ZeRO-3 on Gaudi2 came with SynapseAI 1.19 (the rule is the release's, not the
    card's). `release` None: the release could not be told, which gets the reason too."""
    if generation.key != "gaudi2" or (release is not None and (release.major, release.minor) >= (1, 19)):
        return True, ""
    known = f"this is {release}" if release is not None else "this release could not be told"
    return False, f"ZeRO-3 on Gaudi2 needs SynapseAI 1.19 or newer ({known})."


# The emulated Gaudi follows today's software (eager default, 1.19+ op-list names) and still lets you emulate a
# first-generation Gaudi, as 1.21 does.
EMULATED_RELEASE = Release(1, 21)

"""Facts about each Gaudi generation that the product depends on (capacity, fp16/fp8 support)."""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1 << 30


@dataclass(frozen=True)
class Generation:
    """One Gaudi generation: what a device of this kind can hold and compute."""

    key: str  # "gaudi", "gaudi2", "gaudi3": the value of HPU_NB_DEVICE
    device_name: str  # what habana_frameworks' get_device_name() reports
    hbm_bytes: int
    supports_fp16: bool
    supports_fp8: bool

    @property
    def hbm_gib(self) -> float:
        return self.hbm_bytes / GiB


GENERATIONS: dict[str, Generation] = {
    "gaudi": Generation("gaudi", "GAUDI", 32 * GiB, supports_fp16=False, supports_fp8=False),
    "gaudi2": Generation("gaudi2", "GAUDI2", 96 * GiB, supports_fp16=True, supports_fp8=True),
    "gaudi3": Generation("gaudi3", "GAUDI3", 128 * GiB, supports_fp16=True, supports_fp8=True),
}


def generation_from_name(name: str) -> Generation:
    """Map a key ("gaudi2") or a device name ("GAUDI2", "GAUDI2B", "GAUDI 3") to its generation."""
    text = name.strip().lower().replace(" ", "").replace("-", "")
    if text in GENERATIONS:
        return GENERATIONS[text]
    for key in ("gaudi3", "gaudi2"):
        if text.startswith(key):
            return GENERATIONS[key]
    if text.startswith("gaudi") or text.startswith("hl"):
        return GENERATIONS["gaudi"]
    raise ValueError(f"Unknown Gaudi generation {name!r}; choose one of: {', '.join(GENERATIONS)}.")

"""habana_frameworks.torch.hpu.random, emulated: the card's kernels run on the CPU and draw from its generator.

DeepSpeed's HPU accelerator reaches these as `hpu.random.*` (activation checkpointing saves and restores the state).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

_device_t = torch.device | str | int | None
default_generators = (torch.default_generator,)


def get_rng_state(device: _device_t = "hpu") -> torch.Tensor:
    return torch.get_rng_state()


def set_rng_state(new_state: torch.Tensor, device: _device_t = "hpu") -> None:
    torch.set_rng_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state()]


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    for state in new_states:
        set_rng_state(state)


def manual_seed(seed: int) -> torch.Generator:
    return torch.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    torch.manual_seed(seed)


def seed() -> int:
    return torch.seed()


def seed_all() -> None:
    torch.seed()


def initial_seed() -> int:
    return torch.initial_seed()

"""cuda -> hpu in a device argument, as Habana's toolkit rewrites one (its `core/_utils.convert_device_arg`)."""

from __future__ import annotations

from typing import Any

import torch


def migrates(device: Any) -> bool:
    """Whether a device argument is rewritten: one naming cuda, or a bare device index (CUDA's meaning of an int)."""
    return (isinstance(device, str) and device.startswith("cuda")) or (
        isinstance(device, torch.device) and device.type == "cuda") or (
        isinstance(device, int) and not isinstance(device, bool))


def to_hpu(device: Any) -> Any:
    """"cuda" / "cuda:N" / torch.device("cuda[:N]") become "hpu" / "hpu:N"; an int N or a digit string "N" becomes
    "hpu:N"; anything else (None, "cpu", an hpu device) is returned unchanged. As the toolkit's, the result is a
    string, which every torch call taking a device accepts."""
    if isinstance(device, bool):
        return device
    if isinstance(device, int):
        return f"hpu:{device}"
    if isinstance(device, str):
        if device.startswith("cuda"):
            return "hpu" + device[len("cuda"):]
        return f"hpu:{device}" if device.isdigit() else device
    if isinstance(device, torch.device) and device.type == "cuda":
        return "hpu" if device.index is None else f"hpu:{device.index}"
    return device

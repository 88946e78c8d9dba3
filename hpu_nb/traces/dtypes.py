"""Which floating dtype an op ran in, from the "Input type" args record_shapes=True records."""

from __future__ import annotations

from typing import Any

DTYPE_KINDS = ("bf16", "fp16", "fp8", "fp32", "fp64")
_DTYPE_OF = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32", "double": "fp64"}


def float_kind(types: list[Any]) -> str | None:
    """The lowest float type among an op's input types (a call counts under it); None without float inputs."""
    kinds = {_DTYPE_OF.get(t) or ("fp8" if isinstance(t, str) and "Float8" in t else None) for t in types}
    kinds.discard(None)
    for kind in ("fp8", "bf16", "fp16", "fp32", "fp64"):
        if kind in kinds:
            return kind
    return None

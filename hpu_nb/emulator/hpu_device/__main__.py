"""`python -m hpu_nb.emulator.hpu_device [device] [deepspeed-ops]`: build now what first use would otherwise build.

`device` (the default): the emulated hpu device's library, into hpu_nb's cache directory. `deepspeed-ops`:
DeepSpeed's CPU Adam op (ZeRO-Offload's DeepSpeedCPUAdam), compiled by torch into TORCH_EXTENSIONS_DIR with the
environment hpu_nb gives DeepSpeed (its HPU accelerator), as a notebook's Trainer would. `make setup` and Binder's
postBuild run this, so no notebook cell compiles anything.
"""

from __future__ import annotations

import sys


def build_deepspeed_ops() -> None:
    from hpu_nb.core.strategies.deepspeed import require_deepspeed

    require_deepspeed()
    from deepspeed.accelerator import get_accelerator

    get_accelerator().create_op_builder("CPUAdamBuilder").load()


def main(argv: list[str]) -> int:
    targets = argv or ["device"]
    if not set(targets) <= {"device", "deepspeed-ops"}:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    if "device" in targets:
        from hpu_nb.emulator.hpu_device import build

        print(build.build())
    if "deepspeed-ops" in targets:
        build_deepspeed_ops()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

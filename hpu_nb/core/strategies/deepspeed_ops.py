"""`python -m hpu_nb.core.strategies.deepspeed_ops`: build DeepSpeed's C++ ops now, not in a notebook cell.

ZeRO-Offload's DeepSpeedCPUAdam is a C++ op DeepSpeed compiles with torch's extension builder on first use (a minute
or two here), into TORCH_EXTENSIONS_DIR. This builds it through DeepSpeed's HPU accelerator with the environment
hpu_nb gives DeepSpeed (`require_deepspeed`), as a Trainer's ZeRO-Offload would. `make setup` and Binder's postBuild
run it, so no notebook cell compiles anything.
"""

from __future__ import annotations

import sys

from hpu_nb.core.strategies.deepspeed import require_deepspeed

BUILDERS = ("CPUAdamBuilder",)  # what ZeRO-Offload loads through the HPU accelerator


def build_ops(builders: tuple[str, ...] = BUILDERS) -> None:
    """Compile (or find already compiled) each op in `builders`."""
    require_deepspeed()
    from deepspeed.accelerator import get_accelerator  # noqa: PLC0415 -- lazy: deepspeed is optional (its extra)

    for name in builders:
        get_accelerator().create_op_builder(name).load()


def main(argv: list[str]) -> int:
    if argv:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    build_ops()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

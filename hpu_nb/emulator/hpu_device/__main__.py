"""`python -m hpu_nb.emulator.hpu_device [device]`: build now what first use would otherwise build.

`device` (the default): the emulated hpu device's library, into hpu_nb's cache directory. `make setup` and Binder's
postBuild run this, so no notebook cell compiles anything. (DeepSpeed's CPU Adam op, which needs hpu_nb's Lightning
pieces, is built by `python -m hpu_nb.core.strategies.deepspeed_ops`: the emulator imports nothing from hpu_nb.core.)
"""

from __future__ import annotations

import sys

from hpu_nb.emulator.hpu_device import build

MOVED = {"deepspeed-ops": "python -m hpu_nb.core.strategies.deepspeed_ops"}


def main(argv: list[str]) -> int:
    targets = argv or ["device"]
    for target in set(targets) & set(MOVED):
        print(f"{target}: now built by `{MOVED[target]}`", file=sys.stderr)
    if set(targets) != {"device"}:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    path = build.build()
    if not build.library_is_intact(path, check_digest=True):  # the size is right, the bytes are not: build again
        print(f"{path} is not the library its build recorded: building it again.", file=sys.stderr)
        build.discard_library(path)
        path = build.build()
    problem = build.load_in_child(path)
    if problem:
        print(f"{path} was built but does not load: {problem}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""`python -m hpu_nb.emulator.hpu_device`: build the emulated hpu device's library now (what `make setup` runs)."""

from hpu_nb.emulator.hpu_device import build

if __name__ == "__main__":
    print(build.build())

"""The emulated Gaudi, a product of its own: what stands in for Habana's software where it is absent.

- `hpu_device`: the C++ `hpu` torch device on the CPU (counting allocator, autocast on "hpu", HCCL over gloo);
- `habana`: the emulated `habana_frameworks` package (core, hpu, hpex kernels / optimizers / transformer engine,
  distributed.hccl), found only where no real `habana_frameworks` is installed;
- `fp8`: fp8 numerics on the CPU (float8 casts, scaled matmuls) behind the emulated transformer engine and the
  emulated measure / quantize;
- `backend`: the `DeviceBackend` the runtime seam picks when no Gaudi is found, plugged in below when this package is
  imported (`import hpu_nb` imports it: its finder for `habana_frameworks`), so the runtime never imports the emulator.

It depends on `hpu_nb.runtime` only for the contract the seam owns (generations, releases, environment names, the
DeviceBackend and fp8 engine interfaces); nothing above the runtime seam imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpu_nb.runtime import register_emulated_backend

if TYPE_CHECKING:
    from hpu_nb.runtime.base import DeviceBackend


def _emulated_backend() -> DeviceBackend:
    from hpu_nb.emulator.backend import EmulatedBackend  # noqa: PLC0415 -- lazy: only when the runtime picks it

    return EmulatedBackend()


register_emulated_backend(_emulated_backend)

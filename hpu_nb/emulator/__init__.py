"""The emulated Gaudi, a product of its own: what stands in for Habana's software where it is absent.

- `hpu_device`: the C++ `hpu` torch device on the CPU (counting allocator, autocast on "hpu", HCCL over gloo);
- `habana`: the emulated `habana_frameworks` package (core, hpu, hpex kernels / optimizers / transformer engine,
  distributed.hccl), found only where no real `habana_frameworks` is installed;
- `fp8`: fp8 numerics on the CPU (float8 casts, scaled matmuls) behind the emulated transformer engine and the
  emulated measure / quantize;
- `backend`: the `DeviceBackend` the runtime seam picks when no Gaudi is found.

It depends on `hpu_nb.runtime` only for the facts the seam owns (generations, releases, environment parsing, the
fp8 engine interface); nothing above the runtime seam imports it.
"""

"""fp8 on the emulated Gaudi: numerics (scaled casts, the fp8 matmul) and the layers / files built on them."""

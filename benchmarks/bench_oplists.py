"""Cost of op lists on the emulated hpu device, and of emulated fp8 vs bf16.

Forward + backward of an MLP on `hpu` under bf16 autocast, interleaved in one run: (a) Habana's default lists,
(b) an fp32 list naming an op the model does not use (the lists are the device's AutocastHPU kernels, as on a Gaudi:
no extra mechanism, so this should cost nothing), (c) a lower list that also lowers `softmax` (its casts). The lists
are process-wide, so each round loads the case's lists before it runs (loading is not timed). Also the emulated fp8
layers vs bf16. Case (c) also pays for running softmax in bf16 on this CPU (its bf16 kernels are slower).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from hpu_nb.core.oplists import apply_op_lists, load_op_lists
from hpu_nb.core.precision import hpu_autocast
from hpu_nb.emulator.fp8.training import Fp8Linear, emulated_fp8_autocast
from hpu_nb.emulator.hpu_device import autocast as device_autocast
from hpu_nb.runtime import get_backend


class Block(torch.nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.softmax(torch.relu(layer(x)), -1) * x.shape[-1]
        return x


def step_ms(model: torch.nn.Module, x: torch.Tensor, context) -> float:
    start = time.perf_counter()
    with context():
        loss = model(x).float().sum()
    loss.backward()
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    get_backend()
    torch.manual_seed(0)
    model, x = Block(args.width, args.depth).to("hpu"), torch.randn(args.batch, args.width, device="hpu")
    unused = load_op_lists(fp32=["cosh"])
    used = load_op_lists(lower=sorted(device_autocast.DEFAULT_LOWER_OPS | {"softmax"}))
    fp8_model = Block(args.width, args.depth).to("hpu")
    fp8_model.layers = torch.nn.ModuleList(Fp8Linear(layer) for layer in fp8_model.layers)
    defaults = device_autocast.AutocastLists(device_autocast.DEFAULT_LOWER_OPS, device_autocast.DEFAULT_FP32_OPS)
    lists = {"autocast + unused list": unused, "autocast + softmax->bf16": used}

    def fp8_context():
        stack = hpu_autocast(torch.bfloat16)
        return _Both(stack, emulated_fp8_autocast())

    cases = {
        "autocast": (model, lambda: hpu_autocast(torch.bfloat16)),
        "autocast + unused list": (model, lambda: hpu_autocast(torch.bfloat16)),
        "autocast + softmax->bf16": (model, lambda: hpu_autocast(torch.bfloat16)),
        "fp8 layers": (fp8_model, fp8_context),
    }

    def load(name: str) -> None:
        if name in lists:
            apply_op_lists(lists[name])
        else:
            device_autocast.register(defaults)

    times: dict[str, list[float]] = {name: [] for name in cases}
    for name, (m, ctx) in cases.items():
        load(name)
        step_ms(m, x, ctx)  # warm up
    for _ in range(args.rounds):
        for name, (m, ctx) in cases.items():
            load(name)
            times[name].append(step_ms(m, x, ctx))
    base = statistics.median(times["autocast"])
    print(f"MLP {args.depth} x Linear({args.width}) + relu + softmax, batch {args.batch}, {args.rounds} interleaved "
          f"rounds")
    for name, values in times.items():
        med = statistics.median(values)
        print(f"  {name:26s} {med:8.2f} ms/step   ratio {med / base:5.2f}")


class _Both:
    def __init__(self, *contexts) -> None:
        self.contexts = contexts

    def __enter__(self) -> None:
        for c in self.contexts:
            c.__enter__()

    def __exit__(self, *exc) -> None:
        for c in reversed(self.contexts):
            c.__exit__(*exc)


if __name__ == "__main__":
    main()

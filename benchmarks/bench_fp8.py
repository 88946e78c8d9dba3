"""Cost of an fp8 training step on the emulated Gaudi, against 32-true and bf16-mixed, measured side by side.

One training step (forward, MSE loss, backward, AdamW step) of an MLP of Linear(1024, 1024) layers, batch 64, on
`hpu`, in each precision as HPUPrecisionPlugin runs it: its forward context (autocast on "hpu" for bf16-mixed; the
transformer engine's fp8_autocast for "fp8", with bf16 autocast around it for "fp8 + bf16 autocast"), the fp8 model
converted by `plugin.convert_modules(model, replace_layers=True)`. Then the accuracy of each against 32-true: one
forward and backward from the same weights, the relative error of the output and of a weight gradient.
The three cases take turns round after round (this machine is shared and noisy); each case's median step time is
reported with the fp8 / 32-true and fp8 / bf16-mixed ratios, in wall time and in the CPU time the process used (with
one torch thread, the CPU time is the work a step did, whoever else shares the cores). fp8 runs twice: with the
fused rounding kernel of the emulated device (what training uses) and with the pure-torch rounding passes it replaces.
Not a unit test.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable

import torch

from hpu_nb.core.precision import HPUPrecisionPlugin
from hpu_nb.emulator.fp8.numerics import fused_rounding_kernel, torch_rounding_passes
from hpu_nb.runtime import get_backend

PRECISIONS = ("32-true", "bf16-mixed", "fp8")
# The fp8 case again with the fp8 rounding in torch passes (numerics.torch_rounding_passes), not the fused kernel.
FP8_TORCH_PASSES = "fp8 (torch passes)"
# fp8 with bf16 autocast around it (HPUPrecisionPlugin("fp8", bf16_autocast=True)): the ops outside the fp8 layers
# in bf16, against the default (lightning-habana's: fp8_autocast only, the rest in fp32).
FP8_BF16 = "fp8 + bf16 autocast"
CASES = PRECISIONS + (FP8_BF16, FP8_TORCH_PASSES)


def make_mlp(width: int, depth: int) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for i in range(depth):
        layers.append(torch.nn.Linear(width, width))
        if i < depth - 1:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def make_model(case: str, width: int, depth: int) -> tuple[torch.nn.Module, HPUPrecisionPlugin]:
    """The model (same initial weights for every case, fp8 layers for the fp8 cases) on hpu, and its plugin."""
    precision = "fp8" if case in (FP8_TORCH_PASSES, FP8_BF16) else case
    torch.manual_seed(0)
    model = make_mlp(width, depth)
    plugin = HPUPrecisionPlugin(precision, bf16_autocast=case == FP8_BF16)
    if precision == "fp8":
        plugin.convert_modules(model, replace_layers=True)
    return model.to("hpu"), plugin


def accuracy(case: str, width: int, depth: int, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float, str]:
    """One forward and backward of `case` against 32-true from the same weights: the relative error (Frobenius norm)
    of the output and of the first layer's weight gradient, and the output's dtype."""
    results = {}
    for which in ("32-true", case):
        model, plugin = make_model(which, width, depth)
        with plugin.forward_context():
            out = model(x)
        torch.nn.functional.mse_loss(out.float(), y).backward()
        first = next(p for p in model.parameters() if p.dim() == 2)
        assert first.grad is not None
        results[which] = (out.float().cpu(), first.grad.float().cpu(), str(out.dtype).replace("torch.", ""))
    (out32, grad32, _), (out, grad, dtype) = results["32-true"], results[case]
    return (float((out - out32).norm() / out32.norm()), float((grad - grad32).norm() / grad32.norm()), dtype)


def make_case(case: str, width: int, depth: int) -> Callable[[torch.Tensor, torch.Tensor], tuple[float, float]]:
    """A step function for `case` (same initial weights for every case); it returns its (wall, CPU) ms."""
    model, plugin = make_model(case, width, depth)
    rounding = torch_rounding_passes if case == FP8_TORCH_PASSES else contextlib.nullcontext
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        start, start_cpu = time.perf_counter(), time.process_time()
        with rounding():
            with plugin.forward_context():
                out = model(x)
            loss = torch.nn.functional.mse_loss(out.float(), y)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()  # the step is finished
        return (time.perf_counter() - start) * 1e3, (time.process_time() - start_cpu) * 1e3

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: on a shared machine, a thread descheduled mid-op stalls the others)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    backend = get_backend()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, args.width, generator=g).to("hpu")
    y = torch.randn(args.batch, args.width, generator=g).to("hpu")
    cases = {c: make_case(c, args.width, args.depth) for c in CASES}
    for step in cases.values():
        for _ in range(args.warmup):
            step(x, y)
    times: dict[str, list[tuple[float, float]]] = {c: [] for c in CASES}
    for _ in range(args.rounds):
        for precision, step in cases.items():
            times[precision].append(step(x, y))
    wall = {p: statistics.median(t[0] for t in v) for p, v in times.items()}
    cpu = {p: statistics.median(t[1] for t in v) for p, v in times.items()}
    print(f"{backend.name} backend; MLP {args.depth} x Linear({args.width}), batch {args.batch}, AdamW;"
          f" {args.rounds} interleaved rounds, median step time; torch threads {torch.get_num_threads()}")
    print(f"  fp8 rounding: {'fused kernel' if fused_rounding_kernel() is not None else 'torch passes (no kernel)'}")
    print("  case                 wall ms/step   CPU ms/step")
    for case in CASES:
        print(f"  {case:18s} {wall[case]:12.2f} {cpu[case]:13.2f}")
    for fp8 in ("fp8", FP8_BF16, FP8_TORCH_PASSES):
        for other in ("32-true", "bf16-mixed"):
            print(f"  {fp8:18s} / {other:10s}  wall {wall[fp8] / wall[other]:5.2f}   CPU {cpu[fp8] / cpu[other]:5.2f}")
    ratio_wall, ratio_cpu = wall[FP8_BF16] / wall["fp8"], cpu[FP8_BF16] / cpu["fp8"]
    print(f"  {FP8_BF16} / fp8         wall {ratio_wall:5.2f}   CPU {ratio_cpu:5.2f}")
    print("  accuracy against 32-true, one step from the same weights (relative error, Frobenius norm):")
    print("  case                 output    weight grad   output dtype")
    for case in ("bf16-mixed", "fp8", FP8_BF16):
        out_err, grad_err, dtype = accuracy(case, args.width, args.depth, x, y)
        print(f"  {case:18s} {out_err:9.4f} {grad_err:13.4f}   {dtype}")


if __name__ == "__main__":
    main()

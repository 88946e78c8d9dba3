"""hpu_nb.plan against the emulated card's own counters: planned peak / measured MaxInUse for the same two steps.

Single card (in this process): MLP, CNN, a transformer with SDPA, in 32-true, bf16-mixed, 16-mixed and fp8 (measured
with nn.Linear swapped for the emulated fp8 layers). fp8 is planned twice: in the emulated card's layout (what the
emulated fp8 layers allocate: the ratio that checks the trace) and as a plan is by default, in a Gaudi's layout (1-byte
fp8 operands: FP8_NOTE says why that ratio is below 1 and counts for no target).
Multi-card (two emulated cards, a real Trainer per strategy, rank 0's MaxInUse): the transformer in bf16-mixed under
DDP, DeepSpeed ZeRO-2 / ZeRO-3 and FSDP, each planned without starting a process. Then a Llama-shaped 7B (built on
the meta device from its config, no weights) planned for 8 × Gaudi 2, ZeRO-3, bf16-mixed:
wall time and peak host RSS of a fresh process, its largest batch, and a 6-point batch-size sweep.
Target: every ratio within 0.95-1.05.
Run: PYTHONPATH=. .venv/bin/python benchmarks/bench_plan.py [--quick: single card only] [--llama: the 7B part only]
     [--precision P ...: the single-card rows of these precisions only (and activation checkpointing)]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HPU_NB_BACKEND", "emulated")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import hpu_nb  # noqa: E402
from hpu_nb.emulator.fp8.training import fp8_traced_layout  # noqa: E402 -- the emulated card's fp8 layout
from tests.plan.measure import measured_peak  # noqa: E402
from tests.plan.models import CNN, LLAMA_7B, MLP, CheckpointedTransformer, Transformer, batches  # noqa: E402

MODELS = {"mlp": MLP, "cnn": CNN, "transformer": Transformer}
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "fp8")
MULTI = (("hpu_ddp", "ddp"), ("hpu_deepspeed_stage_2", "deepspeed_stage_2"),
         ("hpu_deepspeed_stage_3", "deepspeed_stage_3"), ("hpu_fsdp", "fsdp"))
BATCH = 16
FP8_NOTE = ("a Gaudi's layout: its transformer engine keeps 1-byte fp8 copies of inputs, weights and gradients and "
            "writes its GEMM outputs in the activation dtype; the emulated fp8 layers keep float32 copies and work "
            "tensors reused between steps, so the emulated card measures more than a Gaudi holds")


def single_card(precisions: tuple[str, ...] = PRECISIONS) -> list[tuple[str, float]]:
    rows = []
    for kind, model_class in MODELS.items():
        for precision in precisions:
            if precision == "fp8":  # the emulated card's layout checks the trace: a Gaudi's is printed beside it
                with fp8_traced_layout("emulated"):
                    planned = hpu_nb.plan(model_class(), batches(kind, BATCH), precision=precision)
                gaudi = hpu_nb.plan(model_class(), batches(kind, BATCH), precision=precision)
            else:
                planned = hpu_nb.plan(model_class(), batches(kind, BATCH), precision=precision)
            gc.collect()
            measured = measured_peak(model_class(), batches(kind, BATCH), precision=precision)
            gc.collect()
            ratio = planned.peak_bytes / measured
            if precision == "fp8":
                rows.append((f"{kind:<11} {precision:<10} single     ", ratio))
                print(f"{kind:<11} {precision:<10} single      planned {planned.peak_bytes:>11,d} B  measured "
                      f"{measured:>11,d} B  ratio {ratio:.4f}  (the emulated card's fp8 layout)", flush=True)
                print(f"{'':<11} {'':<10} as a plan   planned {gaudi.peak_bytes:>11,d} B  ratio "
                      f"{gaudi.peak_bytes / measured:.4f}  (not counted: {FP8_NOTE})", flush=True)
                continue
            rows.append((f"{kind:<11} {precision:<10} single     ", ratio))
            print(f"{kind:<11} {precision:<10} single      planned {planned.peak_bytes:>11,d} B  measured "
                  f"{measured:>11,d} B  ratio {ratio:.4f}  ({planned.method})", flush=True)
    planned = hpu_nb.plan(CheckpointedTransformer(), batches("transformer", BATCH), precision="bf16-mixed")
    gc.collect()
    measured = measured_peak(CheckpointedTransformer(), batches("transformer", BATCH), precision="bf16-mixed")
    rows.append(("transformer bf16-mixed single + activation checkpointing", planned.peak_bytes / measured))
    print(f"transformer bf16-mixed single + activation checkpointing: planned {planned.peak_bytes:,d} B  measured "
          f"{measured:,d} B  ratio {planned.peak_bytes / measured:.4f}", flush=True)
    return rows


def multi_card() -> list[tuple[str, float]]:
    rows = []
    for trainer_name, plan_name in MULTI:
        planned = hpu_nb.plan(Transformer(), batches("transformer", BATCH), precision="bf16-mixed", devices=2,
                              strategy=plan_name)
        with tempfile.TemporaryDirectory() as out:
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            done = subprocess.run(
                [sys.executable, "-m", "tests.plan.multicard_peak", "--kind", "transformer", "--strategy",
                 trainer_name, "--precision", "bf16-mixed", "--devices", "2", "--batch", str(BATCH), "--out", out],
                cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
            reports = sorted(Path(out).glob("rank*.json"))
            if done.returncode != 0 or not reports:
                print(f"transformer bf16-mixed {plan_name}: the measured run failed:\n{done.stderr[-2000:]}")
                continue
            measured = json.loads(reports[0].read_text())["max_in_use"]
        ratio = planned.peak_bytes / measured
        fixed = planned.breakdown["communication"] if "deepspeed" in plan_name else 0
        rest = (planned.peak_bytes - fixed) / (measured - fixed) if fixed else ratio
        rows.append((f"transformer bf16-mixed {plan_name:<17}", ratio))
        print(f"transformer bf16-mixed {plan_name:<17} planned {planned.peak_bytes:>11,d} B  measured "
              f"{measured:>11,d} B"
              f"  ratio {ratio:.4f}" + (f"  (without DeepSpeed's {fixed:,d} B buckets: {rest:.4f})" if fixed else "")
              + f"  ({planned.method})", flush=True)
    return rows


def llama() -> None:
    """The 7B figures, measured in this (fresh) process."""
    start = time.perf_counter()
    with torch.device("meta"):
        model = Transformer(LLAMA_7B)
    batch = torch.zeros(1, LLAMA_7B.seq, dtype=torch.long)
    plan = hpu_nb.plan(model, batch, devices=8, strategy="deepspeed_stage_3", precision="bf16-mixed")
    planned_s = time.perf_counter() - start
    print(plan.to_text())
    start = time.perf_counter()
    largest = plan.largest_batch()
    largest_s = time.perf_counter() - start
    rss_plan = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    sizes = [1, 2, 4, 6, 8, 12]
    sweep = hpu_nb.plan_batch_sizes(model, batch, sizes, devices=8, strategy="deepspeed_stage_3",
                                    precision="bf16-mixed")
    sweep_s = time.perf_counter() - start
    params = sum(p.numel() for p in model.parameters())
    print(f"\nLlama-shaped 7B ({params / 1e9:.2f} B parameters, seq {LLAMA_7B.seq}), 8 × Gaudi 2, ZeRO-3, bf16-mixed:")
    print(f"  plan: {planned_s:.1f} s wall; largest batch per card (10% margin): {largest} ({largest_s:.1f} s more)")
    print(f"  peak host RSS of this process: {rss_plan:.0f} MiB")
    print(f"  6-point sweep {sizes}: {sweep_s:.1f} s wall")
    for item in sweep:
        print(f"    batch {item.batch_size:>2}: peak {item.peak_bytes / 2**30:6.2f} GiB per card, "
              f"{'fits' if item.fits else 'does not fit'}; step {item.step_time_s[0]:.2f}-{item.step_time_s[1]:.2f} s"
              " (estimate)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="single card only")
    parser.add_argument("--llama", action="store_true", help="the 7B part only (run in a fresh process)")
    parser.add_argument("--precision", nargs="+", choices=PRECISIONS, default=list(PRECISIONS),
                        help="single-card rows of these precisions only")
    args = parser.parse_args()
    if args.llama:
        llama()
        return
    rows = single_card(tuple(args.precision))
    if not args.quick:
        rows += multi_card()
    inside = sum(0.95 <= ratio <= 1.05 for _, ratio in rows)
    print(f"\n{inside} of {len(rows)} ratios within 0.95-1.05")
    if not args.quick:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "--llama"], cwd=ROOT, env=env, check=False)


if __name__ == "__main__":
    main()

"""Overhead of MemoryMonitor (memory, loss and throughput sampled every batch, its chart fed every 0.25 s): the same
model trained with and without it, interleaved, in one run.

Three arms, interleaved: no callback, an empty Callback (what Lightning's hook dispatch costs for any callback),
and MemoryMonitor. Prints median process-CPU times (less disturbed by other processes than wall time on a shared
machine), the ratios, and the overhead per batch. Target: monitor / none <= 1.03x. The monitor samples every
batch and pushes to its (headless) widget every 0.25 s, as in a notebook.
Run: .venv/bin/python benchmarks/bench_monitor.py [--width 256 --batch-size 16 for a ~1 ms step]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

os.environ.setdefault("HPU_NB_BACKEND", "emulated")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, TensorDataset

from hpu_nb.notebook.memory_monitor import MemoryMonitor


class MLP(L.LightningModule):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


# no callback; a Callback() that does nothing (Lightning's own dispatch cost); the monitor
ARMS = ("none", "empty", "monitor")


def run(arm: str, data: DataLoader, width: int) -> tuple[float, float, int]:
    torch.manual_seed(0)
    monitor = arm == "monitor"
    callbacks = [MemoryMonitor(auto_display=False)] if monitor else [Callback()] if arm == "empty" else []
    trainer = L.Trainer(accelerator="hpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)
    start, cpu_start = time.perf_counter(), time.process_time()
    trainer.fit(MLP(width), data)
    return time.perf_counter() - start, time.process_time() - cpu_start, (callbacks[0].samples if monitor else 0)


def hook_cost(data: DataLoader, width: int, n: int = 2000) -> float:
    """Microseconds the monitor's two per-batch hooks take (start + end), timed on a set-up Trainer."""
    monitor = MemoryMonitor(auto_display=False)
    trainer = L.Trainer(accelerator="hpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[monitor],
                        limit_train_batches=2)
    trainer.fit(MLP(width), data)
    monitor.setup(trainer, trainer.lightning_module, "fit")
    start = time.perf_counter()
    for _ in range(n):
        monitor.on_train_batch_start(trainer, None, None, 0)
        monitor.on_train_batch_end(trainer, None, None, None, 0)
    return 1e6 * (time.perf_counter() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.batches * args.batch_size, args.width, generator=gen)
    data = DataLoader(TensorDataset(x, torch.randn_like(x)), batch_size=args.batch_size)
    for arm in ARMS:  # warm-up (imports, first-time allocations)
        run(arm, data, args.width)
    wall: dict[str, list[float]] = {arm: [] for arm in ARMS}
    cpu: dict[str, list[float]] = {arm: [] for arm in ARMS}
    samples = 0
    for i in range(args.repeats):
        order = ARMS if i % 2 == 0 else ARMS[::-1]  # interleave, alternating who goes first
        for arm in order:
            elapsed, cpu_s, n = run(arm, data, args.width)
            wall[arm].append(elapsed)
            cpu[arm].append(cpu_s)
            samples = max(samples, n)
    hook_us = hook_cost(data, args.width)
    med = statistics.median
    print(f"model: MLP width {args.width}, batch {args.batch_size}, {args.batches} batches/epoch, emulated Gaudi, "
          f"{args.repeats} interleaved repeats")
    for arm in ARMS:
        print(f"{arm:>8}: median wall {med(wall[arm]):.3f} s, median CPU {med(cpu[arm]):.3f} s "
              f"({1e3 * med(cpu[arm]) / args.batches:.2f} ms CPU per batch)")
    print(f"samples per monitored run: {samples}; the monitor's hooks timed directly: {hook_us:.1f} us per batch; "
          f"from the medians: {1e6 * (med(cpu['monitor']) - med(cpu['none'])) / args.batches:+.0f} us per batch "
          "(the ratio for another model is about 1 + that / its step time)")
    paired = [on / off for on, off in zip(cpu["monitor"], cpu["none"])]
    ratio = med(cpu["monitor"]) / med(cpu["none"])
    print(f"ratio monitor / empty Callback (the monitor's own cost): {med(cpu['monitor']) / med(cpu['empty']):.3f}x")
    print(f"ratio empty Callback / none (Lightning's per-callback dispatch): "
          f"{med(cpu['empty']) / med(cpu['none']):.3f}x")
    print(f"ratio wall (medians): {med(wall['monitor']) / med(wall['none']):.3f}x   "
          f"median of paired CPU ratios: {med(paired):.3f}x")
    print(f"ratio with/without: {ratio:.3f}x (process CPU time, medians; target <= 1.03x) -> "
          f"{'OK' if ratio <= 1.03 else 'ABOVE TARGET'}")


if __name__ == "__main__":
    main()

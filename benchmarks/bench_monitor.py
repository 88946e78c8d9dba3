"""Overhead of MemoryMonitor: the same model trained with and without it, interleaved, in one run.

Prints the median time of each and their ratio (target: at most 1.03x). The monitor samples every batch and
pushes to its (headless) widget every 0.25 s, as in a notebook. Run: .venv/bin/python benchmarks/bench_monitor.py
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

import lightning as L  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from hpu_nb.notebook.memory_monitor import MemoryMonitor  # noqa: E402


class MLP(L.LightningModule):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width))

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.SGD(self.parameters(), lr=0.01)


def run(monitor: bool, data: DataLoader, width: int) -> tuple[float, float, int]:
    torch.manual_seed(0)
    callbacks = [MemoryMonitor(auto_display=False)] if monitor else []
    trainer = L.Trainer(accelerator="hpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)
    start, cpu_start = time.perf_counter(), time.process_time()
    trainer.fit(MLP(width), data)
    return time.perf_counter() - start, time.process_time() - cpu_start, (callbacks[0].samples if monitor else 0)


def hook_cost(data: DataLoader, width: int, n: int = 2000) -> float:
    """Microseconds the monitor's two per-batch hooks take (start + end), timed on a set-up Trainer."""
    monitor = MemoryMonitor(auto_display=False)
    trainer = L.Trainer(accelerator="hpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[monitor], limit_train_batches=2)
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
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--width", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.batches * 16, args.width, generator=gen)
    data = DataLoader(TensorDataset(x, torch.randn_like(x)), batch_size=16)
    run(False, data, args.width)  # warm-up (imports, first-time allocations)
    run(True, data, args.width)
    wall: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}
    samples = 0
    for i in range(args.repeats):
        order = (False, True) if i % 2 == 0 else (True, False)  # interleave, alternating who goes first
        for with_monitor in order:
            elapsed, cpu_s, n = run(with_monitor, data, args.width)
            wall[with_monitor].append(elapsed)
            cpu[with_monitor].append(cpu_s)
            samples = max(samples, n)
    hook_us = hook_cost(data, args.width)
    med = statistics.median
    pair_ratios = [on / off for on, off in zip(cpu[True], cpu[False])]
    ratio_cpu = med(cpu[True]) / med(cpu[False])
    ratio_wall = med(wall[True]) / med(wall[False])
    print(f"model: MLP width {args.width}, {args.batches} batches/epoch, emulated Gaudi, {args.repeats} interleaved repeats")
    for label, on in (("without", False), ("with   ", True)):
        print(f"{label} MemoryMonitor: median wall {med(wall[on]):.3f} s, median CPU {med(cpu[on]):.3f} s "
              f"(CPU: {', '.join(f'{t:.3f}' for t in cpu[on])})")
    print(f"samples per monitored run: {samples}")
    print(f"the monitor's hooks timed directly: {hook_us:.1f} us per batch "
          f"({100 * hook_us * 1e-6 * args.batches / med(cpu[False]):.2f}% of a run without it)")
    print(f"ratio wall (medians): {ratio_wall:.3f}x   ratio CPU (medians): {ratio_cpu:.3f}x   "
          f"median of paired CPU ratios: {med(pair_ratios):.3f}x")
    print(f"ratio with/without: {ratio_cpu:.3f}x (process CPU time; target <= 1.03x) -> "
          f"{'OK' if ratio_cpu <= 1.03 else 'ABOVE TARGET'}")


if __name__ == "__main__":
    main()

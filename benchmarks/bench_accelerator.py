"""Emulated HPU vs Lightning's own CPU accelerator: time per training step, same model and data, in one run.

The emulated Gaudi is a real `hpu` device whose kernels are the CPU's, run on the same host memory; what it adds per
ATen op (one boxed dispatch, CPU aliases of the hpu tensors, adopting fresh outputs as counted device memory) is what
this measures. Three models, from big layers to many tiny ops: an MLP 3x1024, a small transformer encoder (attention,
layer norm, GELU) and a 2x128 MLP. Runs are interleaved (cpu, hpu, cpu, hpu, ...) and medians of the per-step times
are compared. Targets (issue 9): <= 1.10x, <= 1.25x, <= 1.35x.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

import hpu_nb

warnings.filterwarnings("ignore")
logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)


class Classifier(L.LightningModule):
    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def mlp(width: int, depth: int) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))


def transformer(width: int = 128, layers: int = 2, heads: int = 4) -> torch.nn.Module:
    layer = torch.nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.1, activation="gelu", batch_first=True)
    return torch.nn.Sequential(torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False),
                               torch.nn.Linear(width, 10))


@dataclass
class Case:
    name: str
    target: float
    make_net: Callable[[], torch.nn.Module]
    make_data: Callable[[int], DataLoader]


def classification_data(shape: tuple[int, ...], label_shape: tuple[int, ...], batch: int, steps: int) -> DataLoader:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch * steps, *shape, generator=gen)
    y = torch.randint(0, 10, (batch * steps, *label_shape), generator=gen)
    return DataLoader(TensorDataset(x, y), batch_size=batch)


class StepTimer(L.Callback):
    """Wall time of each training batch (forward, backward, optimizer), excluding set-up."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def on_train_batch_start(self, *args) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, *args) -> None:
        self.times.append(time.perf_counter() - self._start)


def run(accelerator: str, case: Case, data: DataLoader, steps: int) -> float:
    torch.manual_seed(0)
    timer = StepTimer()
    trainer = L.Trainer(
        accelerator=accelerator, devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[timer],
    )
    trainer.fit(Classifier(case.make_net()), data)
    return statistics.median(timer.times[3:])  # skip warm-up steps


def compare(case: Case, steps: int, rounds: int) -> float:
    data = case.make_data(steps)
    per_step: dict[str, list[float]] = {"cpu": [], "hpu": []}
    for _ in range(rounds):
        for accelerator in ("cpu", "hpu"):
            per_step[accelerator].append(run(accelerator, case, data, steps))
    cpu, hpu = statistics.median(per_step["cpu"]), statistics.median(per_step["hpu"])
    print(f"{case.name}: {steps} steps x {rounds} rounds each, interleaved")
    print(f"  cpu accelerator      : {cpu * 1e3:8.3f} ms/step (median)")
    print(f"  hpu (emulated Gaudi) : {hpu * 1e3:8.3f} ms/step (median)")
    print(f"  ratio hpu/cpu        : {hpu / cpu:.3f}x (target <= {case.target:.2f}x)")
    return hpu / cpu


CASES = {
    "mlp": Case("MLP 3x1024 + AdamW, batch 64", 1.10, lambda: mlp(1024, 3),
                lambda steps: classification_data((1024,), (), 64, steps)),
    "transformer": Case("transformer encoder 2 x (d=128, 4 heads), batch 16 x 32 tokens", 1.25, transformer,
                        lambda steps: classification_data((32, 128), (32,), 16, steps)),
    "tiny": Case("MLP 2x128 + AdamW, batch 64", 1.35, lambda: mlp(128, 2),
                 lambda steps: classification_data((128,), (), 64, steps)),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    args = parser.parse_args()
    print(f"device: {hpu_nb.get_backend().describe()}; torch threads: {torch.get_num_threads()}")
    ratios = {name: compare(CASES[name], args.steps, args.rounds) for name in args.cases}
    for name, ratio in ratios.items():
        print(f"RESULT emulated HPU / CPU accelerator, {name}: {ratio:.3f}x (target <= {CASES[name].target:.2f}x)")


if __name__ == "__main__":
    main()

"""Measure one rank's peak on the emulated card: `python -m tests.plan.multicard_peak --kind transformer --strategy
hpu_deepspeed_stage_3 --precision bf16-mixed --devices 2 --batch 16 --out DIR` trains two steps with a real Trainer
(Lightning relaunches this script for the other ranks) and each rank writes its card's MaxInUse to DIR/rank<r>.json."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from hpu_nb.runtime import get_backend
from tests.plan.models import CNN, MLP, Transformer, batches


class _PeakWriter(Callback):
    def __init__(self, out: Path) -> None:
        self.out = out

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        stats = get_backend().memory_stats()
        path = self.out / f"rank{trainer.global_rank}.json"
        path.write_text(json.dumps({"rank": trainer.global_rank, "max_in_use": stats["MaxInUse"]}))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", default="transformer")
    parser.add_argument("--strategy", default="hpu_ddp")
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model: Any = {"mlp": MLP, "cnn": CNN, "transformer": Transformer}[args.kind]()
    batch = batches(args.kind, 2 * args.batch)  # two steps of args.batch (DeepSpeed reads the sampler's batch size)
    tensors = batch if isinstance(batch, tuple) else (batch,)
    dataset = torch.utils.data.TensorDataset(*tensors)
    collate = None if isinstance(batch, tuple) else (lambda rows: torch.stack([row[0] for row in rows]))
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch, collate_fn=collate)
    trainer = L.Trainer(accelerator="hpu", devices=args.devices, strategy=args.strategy, precision=args.precision,
                        max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, callbacks=[_PeakWriter(args.out)])
    trainer.fit(model, loader)


if __name__ == "__main__":
    os.environ.setdefault("HPU_NB_BACKEND", "emulated")
    main()

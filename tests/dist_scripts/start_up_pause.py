"""A 2-card fit whose ranks pause at a chosen moment of start-up, for tests that interrupt it there (no sleep races).

Usage: python start_up_pause.py OUT [--start-method popen|fork] --pause RANK:STAGE [--pause RANK:STAGE ...]
Stages: `before_join` (the rank has started and is about to join the process group: Lightning's setup_environment),
`after_join` (the process group exists; the model's setup hook, before the first step). A paused rank writes
OUT/paused-<stage>-<rank>.pid and sleeps ten minutes. Every rank writes OUT/joining<rank>.txt ("<pid> <port>") just
before its own `init_process_group`, and OUT/rank<rank>.pid; the process the user started writes OUT/launcher.pid.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from hpu_nb import HPUParallelStrategy


def _pause_if_asked(out: Path, pauses: set[tuple[int, str]], rank: int, stage: str) -> None:
    if (rank, stage) in pauses:
        Path(out, f"paused-{stage}-{rank}.pid").write_text(str(os.getpid()))
        time.sleep(600)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--start-method", default="popen")
    parser.add_argument("--pause", action="append", default=[])
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pauses = {(int(rank), stage) for rank, stage in (p.split(":") for p in args.pause)}
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))  # one node: the global rank (known before set_world_ranks)
    Path(out, f"rank{local_rank}.pid").write_text(str(os.getpid()))
    if "LOCAL_RANK" not in os.environ:
        Path(out, "launcher.pid").write_text(str(os.getpid()))

    class PausingStrategy(HPUParallelStrategy):
        def setup_environment(self) -> None:
            _pause_if_asked(out, pauses, int(os.environ.get("LOCAL_RANK", "0")), "before_join")
            super().setup_environment()

        def _prepare_hpu_distributed(self) -> str:
            backend = super()._prepare_hpu_distributed()  # the last step before init_process_group
            port = os.environ.get("MASTER_PORT", "")
            Path(out, f"joining{self.global_rank}.txt").write_text(f"{os.getpid()} {port}")
            return backend

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def setup(self, stage: str) -> None:
            _pause_if_asked(out, pauses, self.global_rank, "after_join")

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    x = torch.randn(32, 4)
    trainer = L.Trainer(accelerator="hpu", devices=2, strategy=PausingStrategy(start_method=args.start_method),
                        max_epochs=1, enable_progress_bar=False, enable_model_summary=False, logger=False,
                        enable_checkpointing=False)
    trainer.fit(Model(), DataLoader(TensorDataset(x, x[:, :1]), batch_size=8))
    return 0


if __name__ == "__main__":
    sys.exit(main())

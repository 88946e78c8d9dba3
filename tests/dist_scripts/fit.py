"""Fit a small model on the emulated Gaudi with several processes; run by the tests as a subprocess.

Each rank writes <out>/rank<N>.json (what it saw); rank 0 also saves the trained weights and callback metrics.
Usage: python fit.py --out DIR [--strategy hpu_parallel|hpu_ddp|<deepspeed/fsdp spec>] [--devices 2]
       [--crash-rank R --crash-step S] [--stuck-rank R --stuck-step S] [--ckpt PATH] [--resume PATH] [--epochs N]
       [--precision P] [--start-method fork] [--no-sync-log]
Each rank writes <out>/rank<N>.pid when training starts (the launching process: <out>/launcher.pid). A stuck rank
writes <out>/stuck<R>.pid, then in its training step sleeps for ten minutes, stops or is killed (--stuck-how).
--start-method applies to HPUParallelStrategy (the default strategy) and to DeepSpeed ('ds:...').
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

import hpu_nb  # noqa: F401  (registers "hpu" with Lightning)
from hpu_nb import HPUParallelStrategy
from hpu_nb.runtime import get_backend

if __package__:  # imported by the tests (tests.dist_scripts.fit)
    from .stuck_rank import HOW, get_stuck
else:  # run as a script, from this folder
    from stuck_rank import HOW, get_stuck

FEATURES = 32


def _weights_digest(module: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, value in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(value.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


class Model(L.LightningModule):
    def __init__(
        self, crash_rank: int = -1, crash_step: int = -1, lr: float = 0.05, stuck_rank: int = -1, stuck_step: int = -1,
        out: str | None = None,
    ) -> None:
        super().__init__()
        self.stuck_rank, self.stuck_step, self.out = stuck_rank, stuck_step, out
        self.stuck_how = "sleep"
        self.net = torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        self.crash_rank, self.crash_step, self.lr = crash_rank, crash_step, lr
        self.samples_seen = 0
        self.first_index_sum = 0.0
        self.step_devices: set[str] = set()
        self.deepspeed_checkpointing = False
        self.sync_log = True  # log with sync_dist (a collective of Lightning's in every training step)

    def forward(self, x):
        if self.deepspeed_checkpointing:  # lightning-habana's activation-checkpointing example
            from deepspeed.runtime.activation_checkpointing.checkpointing import checkpoint

            return checkpoint(self.net[2], self.net[1](self.net[0](x)))  # recomputed in backward from a CPU copy
        return self.net(x)

    def on_train_start(self) -> None:
        if self.out:
            Path(self.out, f"rank{self.global_rank}.pid").write_text(str(os.getpid()))

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.global_rank == self.crash_rank and self.global_step == self.crash_step:
            raise RuntimeError(f"rank {self.global_rank} exploded on purpose at step {self.global_step}")
        if self.global_rank == self.stuck_rank and self.global_step == self.stuck_step:
            get_stuck(self.out, self.global_rank, self.stuck_how)
        self.step_devices.update({str(x.device), str(self.net[0].weight.device)})
        self.samples_seen += x.shape[0]
        self.first_index_sum += float(x[:, 0].sum())
        loss = torch.nn.functional.mse_loss(self(x).float(), y)
        self.log("train_loss", loss, sync_dist=self.sync_log)
        self.log("rank_sum", torch.tensor(float(self.global_rank + 1)), reduce_fx="sum", sync_dist=self.sync_log)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class WorkerReport(L.Callback):
    """Each worker process writes worker<rank>.json at the end of training (with spawn, the code after fit() runs only
    in the launching process)."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def on_train_end(self, trainer, pl_module):
        report = {"rank": trainer.global_rank, "pid": os.getpid(), "module_id": os.environ.get("HLS_MODULE_ID"),
                  "master_port": os.environ.get("MASTER_PORT"), "samples_seen": pl_module.samples_seen,
                  "device": str(pl_module.device), "global_step": trainer.global_step,
                  "param_devices": sorted({str(p.device) for p in trainer.strategy.model.parameters()})}
        (self.out / f"worker{trainer.global_rank}.json").write_text(json.dumps(report))


def data(n: int = 64, batch_size: int = 8) -> DataLoader:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, FEATURES, generator=gen)
    y = x[:, :1] * 2.0 - x[:, 1:2]
    return DataLoader(TensorDataset(x, y), batch_size=batch_size)


def make_strategy(spec: str, start_method: str | None = None):
    """A registered name, or 'ds:<stage>[:offload][:cpu_checkpointing]' / 'ds-config:<json path>' /
    'fsdp:<full|sharded>[:offload]' /
    'spawn' (HPUDDPStrategy(start_method="spawn"), as multi-tenant jobs start their workers)."""
    if start_method is not None and spec == "auto":
        return HPUParallelStrategy(start_method=start_method)
    if spec == "spawn":
        from hpu_nb import HPUDDPStrategy

        return HPUDDPStrategy(start_method="spawn")
    if spec.startswith("ds:"):
        from hpu_nb.core.strategies.deepspeed import HPUDeepSpeedStrategy

        parts = spec.split(":")
        strategy = HPUDeepSpeedStrategy(stage=int(parts[1]), offload_optimizer="offload" in parts,
                                        cpu_checkpointing="cpu_checkpointing" in parts,
                                        start_method=start_method or "auto")
        strategy.config["zero_force_ds_cpu_optimizer"] = False  # SGD with offload: fine for a test model
        return strategy
    if spec.startswith("ds-config:"):
        from hpu_nb.core.strategies.deepspeed import HPUDeepSpeedStrategy

        return HPUDeepSpeedStrategy(config=spec.split(":", 1)[1])
    if spec.startswith("fsdp:"):
        from hpu_nb.core.strategies.fsdp import HPUFSDPStrategy

        parts = spec.split(":")
        return HPUFSDPStrategy(state_dict_type=parts[1], cpu_offload="offload" in parts)
    return spec


def _habana_calls() -> dict[str, int]:
    """How often this rank called into the fake habana_frameworks (when the tests run it on the fake Gaudi)."""
    fake = sys.modules.get("habana_frameworks._fake")
    if fake is None:
        return {}
    names = ("mark_step", "memory_stats", "initialize_distributed_hpu", "_lazy_init")
    return {name: fake.STATE.calls.count(name) for name in names}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--precision", default=None)
    parser.add_argument("--crash-rank", type=int, default=-1)
    parser.add_argument("--crash-step", type=int, default=-1)
    parser.add_argument("--start-method", default=None, help="HPUParallelStrategy(start_method=...)")
    parser.add_argument("--stuck-rank", type=int, default=-1)
    parser.add_argument("--stuck-step", type=int, default=-1)
    parser.add_argument("--stuck-how", default="sleep", choices=HOW)
    parser.add_argument("--no-sync-log", action="store_true",
                        help="log without sync_dist: the steps' only collectives are the strategy's (DeepSpeed's own)")
    parser.add_argument("--ckpt", default=None, help="save a checkpoint here after fitting")
    parser.add_argument("--resume", default=None, help="resume fitting from this checkpoint")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    L.seed_everything(7, verbose=False)
    model = Model(args.crash_rank, args.crash_step, stuck_rank=args.stuck_rank, stuck_step=args.stuck_step,
                  out=str(out))
    model.stuck_how = args.stuck_how
    model.sync_log = not args.no_sync_log
    if "LOCAL_RANK" not in os.environ:  # the process the user started (not one a launcher started)
        Path(out, "launcher.pid").write_text(str(os.getpid()))
    model.deepspeed_checkpointing = "cpu_checkpointing" in args.strategy
    trainer = L.Trainer(
        accelerator="hpu",
        devices=args.devices,
        strategy=make_strategy(args.strategy, args.start_method),
        precision=args.precision,
        max_epochs=args.epochs,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
        callbacks=[WorkerReport(out)],
    )
    start = time.perf_counter()
    trainer.fit(model, data(), ckpt_path=args.resume)
    if args.ckpt:
        trainer.save_checkpoint(args.ckpt)
    rank = trainer.global_rank
    stats = get_backend().memory_stats()
    report = {
        "rank": rank,
        "world_size": trainer.world_size,
        "strategy": type(trainer.strategy).__name__,
        "accelerator": type(trainer.accelerator).__name__,
        "process_group_backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
        "samples_seen": model.samples_seen,
        "first_index_sum": model.first_index_sum,
        "global_step": trainer.global_step,
        "epoch": trainer.current_epoch,
        "max_in_use": stats["MaxInUse"],
        "num_allocs": stats["NumAllocs"],
        "pid": os.getpid(),
        "master_port": os.environ.get("MASTER_PORT"),
        "fit_seconds": time.perf_counter() - start,
        "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
        "optimizer": type(getattr(trainer.strategy.model, "basic_optimizer", None)
                          or (trainer.optimizers or [None])[0]).__name__,  # none in a spawn launcher's parent
        "backend": get_backend().name,
        "step_devices": sorted(model.step_devices),
        "habana_calls": _habana_calls(),
        "module_id": os.environ.get("HLS_MODULE_ID"),
        "deepspeed_cpu_checkpoint": getattr(
            sys.modules.get("deepspeed.runtime.activation_checkpointing.checkpointing"), "CPU_CHECKPOINT", None),
        "visible_modules": os.environ.get("HABANA_VISIBLE_MODULES"),
        "weights_digest": _weights_digest(trainer.lightning_module),  # DDP keeps every rank's replica equal
    }
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    if rank == 0:
        state = {k: v.detach().float().cpu() for k, v in trainer.lightning_module.state_dict().items()}
        torch.save(state, out / "weights.pt")
    return 0


if __name__ == "__main__":
    sys.exit(main())

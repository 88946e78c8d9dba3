"""Train a small model with Lightning Fabric on the (emulated or fake) Gaudi; run by the tests as a script.

Each rank writes <out>/rank<N>.json (what it saw). Usage:
  python fabric_fit.py --out DIR [--devices 2] [--strategy auto|hpu_ddp|hpu_fsdp|single_hpu] [--precision P]
                       [--package lightning|standalone] [--steps 6] [--start-method fork]
                       [--stuck-rank R --stuck-step S] [--crash-rank R --crash-step S]
With --start-method fork the training runs in `fabric.launch(function)`, as from a notebook; otherwise the script
calls `fabric.launch()` and trains after it (Lightning's script launcher). Each rank writes <out>/rank<N>.pid when it
starts training (the process the user started: <out>/launcher.pid); a stuck rank writes <out>/stuck<R>.pid, then
before its backward sleeps ten minutes, stops or is killed (--stuck-how); a crashing rank raises there.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

if __package__:  # imported by the tests (tests.dist_scripts.fit)
    from .stuck_rank import HOW, get_stuck
else:  # run as a script, from this folder
    from stuck_rank import HOW, get_stuck

FEATURES = 16


def make_fabric(args: argparse.Namespace):
    if args.package == "standalone":
        from lightning_fabric import Fabric

        import hpu_nb.lightning_fabric as hpu_fabric
    else:
        from lightning.fabric import Fabric

        import hpu_nb.fabric as hpu_fabric
    strategy = args.strategy
    if args.start_method is not None:
        strategy = hpu_fabric.HPUDDPStrategy(start_method=args.start_method)
    if strategy == "hpu_fsdp":
        from torch.distributed.fsdp.wrap import always_wrap_policy

        strategy = hpu_fabric.HPUFSDPStrategy(
            auto_wrap_policy=always_wrap_policy, precision=hpu_fabric.HPUFSDPPrecision(args.precision or "32-true")
        )
        return Fabric(accelerator="hpu", devices=args.devices, strategy=strategy)
    return Fabric(accelerator="hpu", devices=args.devices, strategy=strategy, precision=args.precision)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--precision", default=None)
    parser.add_argument("--package", default="lightning")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--start-method", default=None, help="HPUDDPStrategy(start_method=...)")
    parser.add_argument("--stuck-rank", type=int, default=-1)
    parser.add_argument("--stuck-step", type=int, default=-1)
    parser.add_argument("--stuck-how", default="sleep", choices=HOW)
    parser.add_argument("--crash-rank", type=int, default=-1)
    parser.add_argument("--crash-step", type=int, default=-1)
    parser.add_argument("--ckpt", default=None, help="fabric.save the model there, then fabric.load it back")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if "LOCAL_RANK" not in os.environ:  # the process the user started (not one a launcher started)
        Path(out, "launcher.pid").write_text(str(os.getpid()))

    fabric = make_fabric(args)
    if args.start_method in ("fork", "spawn"):  # as from a notebook: the whole run inside launch(function)
        fabric.launch(train, args, out)
    else:
        fabric.launch()
        train(fabric, args, out)
    return 0


def train(fabric, args: argparse.Namespace, out: Path) -> None:
    Path(out, f"rank{fabric.global_rank}.pid").write_text(str(os.getpid()))
    fabric.seed_everything(7)
    with fabric.init_module():
        model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    if "fsdp" in type(fabric.strategy).__name__.lower():
        model = fabric.setup_module(model)
        optimizer = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.05))
    else:
        model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.05))

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, FEATURES, generator=gen)
    y = x[:, :1] * 2.0 - x[:, 1:2]
    loader = fabric.setup_dataloaders(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8))

    losses, batch_devices, seen, output_dtypes = [], set(), 0, set()
    for step, (xb, yb) in zip(range(args.steps), loader):
        batch_devices.add(str(xb.device))
        seen += xb.shape[0]
        out_b = model(xb)
        output_dtypes.add(str(out_b.dtype))
        loss = torch.nn.functional.mse_loss(out_b.float(), yb)
        if fabric.global_rank == args.crash_rank and step == args.crash_step:
            raise RuntimeError(f"rank {fabric.global_rank} exploded on purpose at step {step}")
        if fabric.global_rank == args.stuck_rank and step == args.stuck_step:
            get_stuck(out, fabric.global_rank, args.stuck_how)
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()
        losses.append(float(loss.detach()))

    loaded_step = None
    if args.ckpt:  # a checkpoint round trip: saved, then loaded back into the same objects
        fabric.save(args.ckpt, {"model": model, "step": len(losses)})  # (FSDP cannot load plain SGD's empty state)
        loaded_step = fabric.load(args.ckpt, {"model": model})["step"]
    rank_sum = fabric.all_reduce(torch.tensor(float(fabric.global_rank + 1)), reduce_op="sum")
    mean_loss = fabric.all_reduce(torch.tensor(losses[-1]), reduce_op="mean")
    params = {}
    fsdp = None
    if "fsdp" in type(fabric.strategy).__name__.lower():
        from torch.distributed.fsdp import FullyShardedDataParallel

        wrapped = [m for m in model.modules() if isinstance(m, FullyShardedDataParallel)]
        mp = wrapped[0].mixed_precision
        fsdp = {
            "wrapped": len(wrapped),
            "param_dtype": str(mp.param_dtype), "reduce_dtype": str(mp.reduce_dtype),
            "buffer_dtype": str(mp.buffer_dtype),
            "local_numel": sum(p.numel() for p in model.parameters()),
            "param_device": str(next(model.parameters()).device),
        }
    else:
        params = {k: v.detach().cpu().flatten()[:4].tolist() for k, v in model.state_dict().items()}

    fake = sys.modules.get("habana_frameworks._fake")
    report = {
        "rank": fabric.global_rank,
        "world_size": fabric.world_size,
        "loaded_step": loaded_step,
        "strategy": type(fabric.strategy).__name__,
        "strategy_module": type(fabric.strategy).__module__,
        "accelerator": type(fabric.accelerator).__name__,
        "precision": type(fabric.strategy.precision).__name__,
        "device": str(fabric.device),
        "batch_devices": sorted(batch_devices),
        "output_dtypes": sorted(output_dtypes),
        "samples_seen": seen,
        "losses": losses,
        "rank_sum": float(rank_sum),
        "mean_loss": float(mean_loss),
        "process_group_backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
        "params": params,
        "fsdp": fsdp,
        "pid": os.getpid(),
        "habana_calls": {n: fake.STATE.calls.count(n) for n in ("mark_step", "initialize_distributed_hpu")}
        if fake is not None else {},
    }
    (out / f"rank{fabric.global_rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    sys.exit(main())

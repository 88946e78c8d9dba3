"""What the cluster tests launch: one small regression trained on `hpu` by every rank, each rank writing a report.

    python ranks.py lightning OUT N       a rank of a Lightning Trainer(accelerator="hpu", strategy="hpu_ddp")
    python ranks.py torch OUT             a rank of Habana's plain-torch pattern: initialize_distributed_hpu(),
                                          init_process_group("hccl"), DistributedDataParallel on hpu
    python ranks.py ray-torch OUT         a Ray Train driver: TorchTrainer, 2 workers with {"HPU": 1}, the torch pattern
    python ranks.py ray-lightning OUT     the same with a Lightning Trainer and RayTrainReportCallback in each worker

mpirun and srun start the first two once per rank; each rank writes OUT/rank<N>.json: its rank, world size, local
rank, the device its weights are on, the process group's backend, Lightning's cluster environment, its card
(HLS_MODULE_ID) and a digest of its final weights (equal on every rank when the gradients were all-reduced).
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import sys
from pathlib import Path

WORKERS = 2
STEPS = 6


def _data(rank: int, world_size: int):
    """Each rank its own half of one fixed data set (what a DistributedSampler gives), so the gradients differ."""
    import torch

    generator = torch.Generator().manual_seed(7)
    x = torch.randn(32 * world_size, 8, generator=generator)
    y = x @ torch.arange(1.0, 9.0).unsqueeze(1)
    return x[rank::world_size], y[rank::world_size]


def _model():
    import torch

    torch.manual_seed(0)  # the same start on every rank (DDP would broadcast rank 0's anyway)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _digest(module) -> str:
    digest = hashlib.sha256()
    for name, value in sorted(module.state_dict().items()):
        digest.update(name.removeprefix("module.").encode())
        digest.update(value.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


def _report(out: Path, rank: int, **facts) -> None:
    import torch.distributed as dist

    facts.update(rank=rank, world_size=dist.get_world_size(), backend=dist.get_backend(),
                 module_id=os.environ.get("HLS_MODULE_ID"))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(facts))


def _train(model, device, rank: int, world_size: int):
    """STEPS of SGD on this rank's shard of the data (plain torch, DDP-wrapped `model`); returns a weight."""
    import torch

    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = (t.to(device) for t in _data(rank, world_size))
    for _ in range(STEPS):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return next(model.parameters())


def plain_torch(out: Path) -> None:
    """Habana's pattern (its MNIST example, Model-References): the ranks from Open MPI's or the launcher's variables."""
    import habana_frameworks.torch.core  # noqa: F401
    import torch
    import torch.distributed as dist
    from habana_frameworks.torch.distributed.hccl import initialize_distributed_hpu
    from torch.nn.parallel import DistributedDataParallel

    world_size, rank, local_rank = initialize_distributed_hpu()
    dist.init_process_group("hccl", rank=rank, world_size=world_size)
    device = torch.device("hpu")
    model = DistributedDataParallel(_model().to(device))
    weight = _train(model, device, rank, world_size)
    _report(out, rank, local_rank=local_rank, device=weight.device.type, digest=_digest(model), environment=None)
    # DDP's reducer first, then the group: destroyed the other way round, with the reducer left to interpreter exit,
    # torch's gloo (under the emulated HCCL, and plain gloo on the CPU alike) often aborts the process at exit
    # ("terminate called without an active exception") when mpirun binds each rank to one core.
    del model, weight  # (the optimizer went with _train)
    gc.collect()
    dist.destroy_process_group()


def _lightning_module():
    import lightning as L
    import torch

    class Regression(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _model()

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.trained_on = {x.device.type, self.net[0].weight.device.type}  # Lightning moves it to cpu at the end
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("loss", loss, sync_dist=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    return Regression()


def lightning(out: Path, devices: int, plugins: list | None = None, callbacks: list | None = None) -> None:
    """A plain Lightning Trainer: the cluster environment (MPI, SLURM, Ray's) comes from the launcher's variables."""
    import lightning as L
    import torch.distributed as dist
    from torch.utils.data import DataLoader, TensorDataset

    import hpu_nb  # noqa: F401  (registers "hpu" and the HPU strategies with Lightning)

    module = _lightning_module()
    trainer = L.Trainer(accelerator="hpu", devices=devices, strategy="hpu_ddp", max_steps=STEPS, plugins=plugins,
                        callbacks=callbacks, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, use_distributed_sampler=False, default_root_dir=str(out))
    rank, world_size = trainer.global_rank, trainer.world_size
    x, y = _data(rank, world_size)
    trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=len(x)))
    if dist.is_initialized():
        _report(out, rank, local_rank=trainer.local_rank, device=",".join(sorted(module.trained_on)),
                digest=_digest(module), environment=type(trainer.strategy.cluster_environment).__name__)


def _ray_worker(config: dict) -> None:
    """train_loop_per_worker: Ray has set RANK / LOCAL_RANK / WORLD_SIZE and, with TorchConfig(backend="hccl"),
    imported Habana's HCCL and opened the process group."""
    out = Path(config["out"])
    if config["mode"] == "torch":
        import ray.train.torch
        import torch.distributed as dist

        rank, world_size = dist.get_rank(), dist.get_world_size()
        device = ray.train.torch.get_device()
        # torch.device("hpu") has no index; DistributedDataParallel takes it from the module's device here, as
        # hpu_nb's strategies do (device_ids=None): one card per process.
        model = ray.train.torch.prepare_model(_model(), parallel_strategy_kwargs={"device_ids": None,
                                                                                  "output_device": None})
        weight = _train(model, device, rank, world_size)
        _report(out, rank, local_rank=ray.train.get_context().get_local_rank(), device=weight.device.type,
                digest=_digest(model), environment=None, ray_device=str(device))
    else:
        import ray.train
        from ray.train.lightning import RayLightningEnvironment, RayTrainReportCallback

        # HPUDDPStrategy with Ray's cluster environment; devices = the workers on this node (one card each).
        local_world_size = ray.train.get_context().get_local_world_size()
        lightning(out, local_world_size, plugins=[RayLightningEnvironment()], callbacks=[RayTrainReportCallback()])


def ray_driver(out: Path, mode: str) -> None:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=True)
    try:
        print(f"HPU resources: {ray.cluster_resources().get('HPU')}", flush=True)
        trainer = TorchTrainer(
            _ray_worker,
            train_loop_config={"out": str(out), "mode": mode},
            torch_config=TorchConfig(backend="hccl"),
            scaling_config=ScalingConfig(num_workers=WORKERS, resources_per_worker={"HPU": 1, "CPU": 1}),
            run_config=RunConfig(storage_path=str(out / "ray_results"), name=mode),
        )
        result = trainer.fit()
        summary = {"metrics": {k: v for k, v in (result.metrics or {}).items() if isinstance(v, (int, float))},
                   "checkpoint": result.checkpoint.path if result.checkpoint else None}
        (out / "ray_result.json").write_text(json.dumps(summary))
    finally:
        ray.shutdown()


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    if mode == "torch":
        plain_torch(out)
    elif mode == "lightning":
        lightning(out, devices=int(sys.argv[3]))  # the processes per node, as the launcher was told
    elif mode in ("ray-torch", "ray-lightning"):
        ray_driver(out, mode.removeprefix("ray-"))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()

"""lightning-habana's DeepSpeed `test_lightning_model` scenario, run as a subprocess, printing what happened as JSON.

The model and data are the plugin's in behaviour (four element-wise scale layers, three through DeepSpeed's activation
checkpointing, ones in, zeros out, AdamW, DeepSpeed's WarmupDecayLR from the config), rewritten here.
`--flavour hpu_nb` trains with HPUDeepSpeedStrategy on the (emulated) Gaudi; `--flavour lightning-cpu` with
Lightning's own DeepSpeedStrategy on the CPU accelerator (DeepSpeed's CPU accelerator), as the reference.
Prints {"losses": [...per micro-batch], "optimizer_steps_before": [...], "final_loss": x, "engine_steps": n,
"gradient_accumulation_steps": n}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

FEATURES = 10
SAMPLES = 16
BATCH = 2


def build(flavour: str, accumulate: int, micro_batch: int, stage: int):
    import lightning as L
    import torch
    from deepspeed.runtime.activation_checkpointing.checkpointing import checkpoint
    from torch.utils.data import DataLoader, Dataset

    device = "hpu" if flavour == "hpu_nb" else "cpu"

    class Ones(Dataset):
        def __len__(self):
            return SAMPLES

        def __getitem__(self, index):
            return torch.ones(FEATURES, device=device), torch.zeros(FEATURES, device=device)

    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(FEATURES))

        def forward(self, x):
            return x * self.w

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.l1, self.l2, self.l3, self.l4 = Scale(), Scale(), Scale(), Scale()
            self.losses: list[float] = []
            self.steps_before: list[int] = []

        def forward(self, x):
            return checkpoint(self.l4, checkpoint(self.l3, checkpoint(self.l2, self.l1(x))))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.sum(torch.abs(y - self(x))) / (2 * 10 * 50)
            self.losses.append(loss.item())
            self.steps_before.append(int(self.trainer.model.global_steps))
            self.log("train_loss", loss.item(), sync_dist=True, reduce_fx="sum")
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters())

        def train_dataloader(self):
            return DataLoader(Ones(), batch_size=BATCH)

    config = {
        "train_batch_size": accumulate * micro_batch,
        "train_micro_batch_size_per_gpu": micro_batch,
        "bf16": {"enabled": False},
        "fp16": {"enabled": False},
        "scheduler": {"type": "WarmupDecayLR", "params": {
            "warmup_min_lr": 0.02, "warmup_max_lr": 0.05, "warmup_num_steps": 4, "total_num_steps": 2,
            "warmup_type": "linear"}},
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": stage},
        "zero_force_ds_cpu_optimizer": False,
    }
    if flavour == "hpu_nb":
        from hpu_nb import HPUAccelerator
        from hpu_nb.core.strategies.deepspeed import HPUDeepSpeedPrecisionPlugin, HPUDeepSpeedStrategy

        accelerator = HPUAccelerator()
        strategy = HPUDeepSpeedStrategy(config=config, parallel_devices=[torch.device("hpu")])
        plugins = [HPUDeepSpeedPrecisionPlugin("bf16-mixed")]
    else:
        from lightning.pytorch.strategies import DeepSpeedStrategy

        class CPUDeepSpeedStrategy(DeepSpeedStrategy):
            """Lightning's DeepSpeedStrategy with only its CUDA-only check skipped (DeepSpeed's CPU accelerator)."""

            def setup_environment(self):
                from lightning.pytorch.strategies.ddp import DDPStrategy

                DDPStrategy.setup_environment(self)

        accelerator = "cpu"
        strategy = CPUDeepSpeedStrategy(config=config, parallel_devices=[torch.device("cpu", 0)],
                                        process_group_backend="gloo")
        plugins = [L.pytorch.plugins.precision.DeepSpeedPrecision("bf16-mixed")]
    trainer = L.Trainer(
        accelerator=accelerator, strategy=strategy, plugins=plugins, devices=1, fast_dev_run=10,
        enable_progress_bar=False, use_distributed_sampler=False, limit_train_batches=16,
        accumulate_grad_batches=accumulate, enable_model_summary=False, logger=False,
    )
    return Model(), trainer


def model_deepspeed_0_14_warmup() -> None:
    """DeepSpeed up to 0.14 (Habana's fork up to 1.19): WarmupLR / WarmupDecayLR left the optimizer's own lr in place
    until their first step() (after the first optimizer step); PR #6597 set the warm-up's first lr at construction."""
    from deepspeed.runtime import lr_schedules

    new_init = lr_schedules.WarmupLR.__init__

    def old_init(self, optimizer, *args, **kwargs):
        own_lrs = [group["lr"] for group in optimizer.param_groups]
        new_init(self, optimizer, *args, **kwargs)
        if self.last_batch_iteration == -1:
            for group, lr in zip(optimizer.param_groups, own_lrs):
                group["lr"] = lr
            self._last_lr = own_lrs

    lr_schedules.WarmupLR.__init__ = old_init


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--flavour", choices=("hpu_nb", "lightning-cpu"), default="hpu_nb")
    parser.add_argument("--accumulate", type=int, default=2)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--stage", type=int, default=0)
    parser.add_argument("--deepspeed-0.14-schedulers", dest="old_schedulers", action="store_true",
                        help="DeepSpeed's WarmupLR before its PR #6597 (2024-10): the first step at the optimizer's lr")
    args = parser.parse_args()
    if args.flavour == "lightning-cpu":
        os.environ["DS_ACCELERATOR"] = "cpu"  # before DeepSpeed is imported
    if args.old_schedulers:
        model_deepspeed_0_14_warmup()
    model, trainer = build(args.flavour, args.accumulate, args.micro_batch, args.stage)
    trainer.fit(model)
    engine = trainer.model
    print("RESULT " + json.dumps({
        "losses": model.losses, "optimizer_steps_before": model.steps_before,
        "final_loss": float(trainer.callback_metrics["train_loss"]), "engine_steps": int(engine.global_steps),
        "gradient_accumulation_steps": int(engine.gradient_accumulation_steps()),
        "weights": [float(model.l1.w[0]), float(model.l4.w[0])],
    }), flush=True)
    # Shut the (one-rank) process group down before the interpreter does: left to exit, gloo's threads once raced its
    # teardown ("terminate called without an active exception", SIGABRT after the result) on a loaded machine.
    import torch.distributed as dist  # imported here, as the script's other imports: after DS_ACCELERATOR is set

    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

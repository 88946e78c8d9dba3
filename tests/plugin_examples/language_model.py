"""lightning-habana's examples/pytorch/language_model.py, rewritten for hpu_nb: a Transformer language model trained
on several cards with FSDP (FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD, NO_SHARD; transformer layers wrapped, bf16) or
DDP with HPUPrecisionPlugin, reporting each card's peak memory. A synthetic token stream replaces WikiText-2, and the
model is smaller (--small) so that it runs in the test suite on the emulated Gaudi. Prints "RESULT {json}".
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import habana_frameworks.torch as htorch
import lightning as L
import torch
from lightning.pytorch.demos import Transformer
from lightning.pytorch.utilities import rank_zero_info
from synthetic import TokenStream
from torch import nn
from torch.utils.data import DataLoader

from hpu_nb import HPUAccelerator, HPUDDPStrategy, HPUFSDPPrecision, HPUFSDPStrategy, HPUPrecisionPlugin

STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD", "DDP")
GiB = 1024**3


class LanguageModel(L.LightningModule):
    def __init__(self, vocab_size: int, small: bool = False) -> None:
        super().__init__()
        sizes = {"ninp": 32, "nhead": 2, "nhid": 64, "nlayers": 1} if small else {}
        self.model = Transformer(vocab_size=vocab_size, **sizes)

    def training_step(self, batch, batch_idx):
        inputs, target = batch
        loss = nn.functional.nll_loss(self.model(inputs, target), target.view(-1))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.1)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Language model with FSDP or DDP on HPU.")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("-d", "--devices", type=int, default=2)
    parser.add_argument("-s", "--strategy", default="FULL_SHARD", help=f"one of {', '.join(STRATEGIES)}")
    parser.add_argument("--small", action="store_true", help="a small Transformer and data (for the test suite)")
    return parser.parse_args()


def main() -> int:
    L.seed_everything(42)
    options = parse_args()
    os.environ["PT_HPU_LAZY_MODE"] = "0"  # as the plugin's example: FSDP runs in eager mode
    if options.devices < 2:
        print("The script requires a multi device setup")
        return 1
    if options.strategy not in STRATEGIES:
        print(f"Invalid strategy {options.strategy}: choose one of {', '.join(STRATEGIES)}")
        return 1
    dataset = TokenStream(tokens=1024 if options.small else 65536)
    loader = DataLoader(dataset, batch_size=4, num_workers=0 if options.small else 2)
    model = LanguageModel(dataset.vocab_size, small=options.small)
    if options.strategy == "DDP":
        trainer = L.Trainer(accelerator=HPUAccelerator(), devices=options.devices, strategy=HPUDDPStrategy(),
                            plugins=HPUPrecisionPlugin(device="hpu", precision="bf16-mixed"), fast_dev_run=10,
                            enable_progress_bar=False)
    else:
        strategy = HPUFSDPStrategy(parallel_devices=[torch.device("hpu")] * options.devices,
                                   sharding_strategy=options.strategy,
                                   auto_wrap_policy={nn.TransformerEncoderLayer, nn.TransformerDecoderLayer},
                                   precision_plugin=HPUFSDPPrecision("bf16-mixed"))
        trainer = L.Trainer(accelerator=HPUAccelerator(), devices=options.devices, strategy=strategy, fast_dev_run=1,
                            enable_progress_bar=False)
    trainer.fit(model, loader)
    peak = htorch.hpu.max_memory_allocated()
    rank_zero_info(f"Peak memory allocated with {options.strategy} on HPU: {peak / GiB} GB")
    if trainer.is_global_zero:
        print("RESULT " + json.dumps({"strategy": type(trainer.strategy).__name__, "world_size": trainer.world_size,
                                      "global_step": trainer.global_step, "peak_bytes": peak,
                                      "train_loss": float(trainer.callback_metrics["train_loss"])}), flush=True)
    htorch.hpu.reset_peak_memory_stats()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""trainer.fit with HPUDeepSpeedStrategy and a configure_optimizers returning None (lightning-habana's
invalid-optimizer scenario, rewritten); prints {"error": <exception type>, "message": ...}."""

from __future__ import annotations

import json
import sys

import lightning as L
import torch
from lightning.pytorch.demos.boring_classes import BoringModel

from hpu_nb import HPUAccelerator
from hpu_nb.core.strategies.deepspeed import HPUDeepSpeedPrecisionPlugin, HPUDeepSpeedStrategy


class NoOptimizer(BoringModel):
    def configure_optimizers(self):
        return None


def main() -> int:
    trainer = L.Trainer(accelerator=HPUAccelerator(), devices=1, max_epochs=1, logger=False, enable_progress_bar=False,
                        strategy=HPUDeepSpeedStrategy(parallel_devices=[torch.device("hpu")]),
                        plugins=[HPUDeepSpeedPrecisionPlugin("bf16-mixed")], enable_checkpointing=False)
    try:
        trainer.fit(NoOptimizer())
    except Exception as err:
        print("RESULT " + json.dumps({"error": type(err).__name__, "message": str(err)}))
        return 0
    print("RESULT " + json.dumps({"error": None, "message": ""}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

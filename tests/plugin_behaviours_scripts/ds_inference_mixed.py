"""lightning-habana's DeepSpeed inference scenario: HPUDeepSpeedPrecisionPlugin("bf16-mixed") with init_inference
arguments (dtype, tensor_parallel, replace_with_kernel_inject, injection_policy) given to the strategy or in its config.

The model is the plugin's in behaviour (four layers computing x * (x @ w), all weights one, one sample of two ones:
2, 8, 128, 32768), rewritten here. Prints {"preds": [...], "pred_dtype": ..., "weights_dtype": ..., "engine": ...}.
Usage: python ds_inference_mixed.py kwargs|config [float32|float16|bfloat16] [precision]
"""

from __future__ import annotations

import json
import sys

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from hpu_nb import HPUAccelerator
from hpu_nb.core.strategies.deepspeed import HPUDeepSpeedPrecisionPlugin, HPUDeepSpeedStrategy


class XTimesXw(torch.nn.Module):
    def __init__(self, size: int = 2) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(size))

    def forward(self, x):
        return x * torch.matmul(x, self.w)


class InferenceModel(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2, self.l3, self.l4 = XTimesXw(), XTimesXw(), XTimesXw(), XTimesXw()

    def forward(self, x):
        return self.l4(self.l3(self.l2(self.l1(x))))

    def predict_step(self, batch, batch_idx):
        return self(batch[0])


def main() -> int:
    mode = sys.argv[1]
    dtype = getattr(torch, sys.argv[2] if len(sys.argv) > 2 else "float32")
    precision = sys.argv[3] if len(sys.argv) > 3 else "bf16-mixed"
    engine_args = {"dtype": dtype, "tensor_parallel": {"tp_size": 1}, "replace_with_kernel_inject": False}
    if mode == "kwargs":
        strategy = HPUDeepSpeedStrategy(parallel_devices=[torch.device("hpu")], replace_method="auto",
                                        injection_policy={InferenceModel: ("l1",)}, **engine_args)
    else:
        strategy = HPUDeepSpeedStrategy(parallel_devices=[torch.device("hpu")], config=engine_args)
    trainer = L.Trainer(accelerator=HPUAccelerator(), devices=1, strategy=strategy, use_distributed_sampler=False,
                        plugins=[HPUDeepSpeedPrecisionPlugin(precision)], logger=False, enable_progress_bar=False)
    preds = trainer.predict(InferenceModel(), DataLoader(TensorDataset(torch.ones(1, 2))))
    module = trainer.strategy.model.module
    print("RESULT " + json.dumps({
        "preds": preds[0].detach().cpu().float().tolist(), "pred_dtype": str(preds[0].dtype),
        "weights_dtype": str(module.l1.w.dtype), "engine": type(trainer.strategy.model).__name__,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())

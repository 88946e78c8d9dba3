"""Predict through DeepSpeed's inference engine with HPUDeepSpeedStrategy; run by tests/core/test_plugin_behaviours.py.

Usage: python ds_inference.py kwargs|config   (init_inference arguments given to the strategy, or in its config)
"""

import json
import sys

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from hpu_nb import HPUDeepSpeedStrategy


class M(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.l1 = torch.nn.Linear(4, 8)
        self.l2 = torch.nn.Linear(8, 2)
    def forward(self, x): return self.l2(torch.relu(self.l1(x)))
    def predict_step(self, batch, batch_idx): return self(batch[0])

mode = sys.argv[1]
x = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))
model = M()
expected = model(x).detach()
if mode == "kwargs":
    strategy = HPUDeepSpeedStrategy(dtype=torch.float, tensor_parallel={"tp_size": 1}, replace_with_kernel_inject=False)
else:
    strategy = HPUDeepSpeedStrategy(config={"dtype": torch.float, "tensor_parallel": {"tp_size": 1},
                                            "replace_with_kernel_inject": False})
trainer = L.Trainer(accelerator="hpu", devices=1, strategy=strategy, logger=False, enable_progress_bar=False)
preds = trainer.predict(model, DataLoader(TensorDataset(x), batch_size=3))
print(json.dumps({"engine": type(trainer.strategy.model).__name__,
                  "inference_kwargs": sorted(strategy.inference_kwargs),
                  "close": bool(torch.allclose(torch.cat([p.cpu().float() for p in preds]), expected, atol=1e-6)),
                  "device": str(preds[0].device)}))

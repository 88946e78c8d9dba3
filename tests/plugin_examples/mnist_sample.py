"""lightning-habana's examples/pytorch/mnist_sample.py, rewritten for hpu_nb: the MNIST classifiers its trainer
example trains (a linear layer on flattened images; and the same under torch.autocast on "hpu", optionally checking
that custom op lists took effect)."""

from __future__ import annotations

import lightning as L
import torch
from torch.nn import functional as F


class LitClassifier(L.LightningModule):
    """One linear layer on the flattened image, ReLU, cross entropy; accuracy logged in validation and test."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(28 * 28, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.l1(x.flatten(1)))

    def training_step(self, batch, batch_idx):
        images, labels = batch
        loss = F.cross_entropy(self(images), labels)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        self.log("val_acc", self.accuracy(self(images), labels))

    def test_step(self, batch, batch_idx):
        images, labels = batch
        self.log("test_acc", self.accuracy(self(images), labels))

    @staticmethod
    def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return (logits.argmax(dim=-1) == labels).float().mean()

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.02)


class LitAutocastClassifier(LitClassifier):
    """The steps run in torch.autocast("hpu", bfloat16). With `op_override`, each forward checks the custom op lists
    (tests/plugin_examples/ops_*_mnist.txt): mm listed as float32, tan as bfloat16."""

    def __init__(self, op_override: bool = False) -> None:
        super().__init__()
        self.op_override = op_override
        self.override_checks = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.op_override:
            self.check_override(x.flatten(1))
        return super().forward(x)

    def check_override(self, x: torch.Tensor) -> None:
        product = torch.mm(x, torch.eye(x.shape[1], device=x.device, dtype=x.dtype))
        tangent = torch.tan(x)
        assert product.dtype == torch.float32, f"mm ran in {product.dtype}: the float32 op list was not applied"
        assert tangent.dtype == torch.bfloat16, f"tan ran in {tangent.dtype}: the lower-precision list was not applied"
        self.override_checks += 1

    def training_step(self, batch, batch_idx):
        with torch.autocast(device_type="hpu", dtype=torch.bfloat16):
            return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        with torch.autocast(device_type="hpu", dtype=torch.bfloat16):
            return super().validation_step(batch, batch_idx)

    def test_step(self, batch, batch_idx):
        with torch.autocast(device_type="hpu", dtype=torch.bfloat16):
            return super().test_step(batch, batch_idx)

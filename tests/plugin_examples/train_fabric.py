"""lightning-habana's examples/fabric/image_classifier/train_fabric.py, rewritten for hpu_nb: a small CNN trained
with Lightning Fabric on one HPU (HPUAccelerator, SingleHPUStrategy), Adadelta with a StepLR schedule, tested each
epoch with torchmetrics' Accuracy on the device. Synthetic MNIST-shaped data (synthetic.py) replaces the download
(and torchvision's transforms: the samples are already normalised tensors). Prints "RESULT {json}" at the end.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from lightning.fabric import Fabric, seed_everything
from synthetic import mnist_like
from torch import nn, optim
from torch.optim.lr_scheduler import StepLR
from torchmetrics.classification import Accuracy

from hpu_nb.fabric import HPUAccelerator, SingleHPUStrategy


class Net(nn.Module):
    """Two convolutions, max-pooling, dropout and two linear layers: log-probabilities of the ten classes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def run(hparams: argparse.Namespace) -> dict:
    fabric = Fabric(accelerator=HPUAccelerator(), devices=1, strategy=SingleHPUStrategy())
    seed_everything(hparams.seed)
    with fabric.rank_zero_first(local=False):  # where the plugin's example downloads MNIST
        train_dataset = mnist_like(hparams.train_samples, seed=1)
        test_dataset = mnist_like(hparams.test_samples, seed=2)
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=hparams.batch_size)
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=hparams.batch_size)
    train_loader, test_loader = fabric.setup_dataloaders(train_loader, test_loader)

    model = Net()
    optimizer = optim.Adadelta(model.parameters(), lr=hparams.lr)
    model, optimizer = fabric.setup(model, optimizer)
    scheduler = StepLR(optimizer, step_size=1, gamma=hparams.gamma)
    test_acc = Accuracy(task="multiclass", num_classes=10).to(fabric.device)

    losses, report = [], {}
    for epoch in range(1, hparams.epochs + 1):
        model.train()
        for batch_idx, (data, target) in enumerate(train_loader):
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            fabric.backward(loss)
            optimizer.step()
            losses.append(loss.item())
            if batch_idx == 0 or (batch_idx + 1) % hparams.log_interval == 0:
                print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.dataset)}]"
                      f"\tLoss: {loss.item():.6f}")
                if hparams.dry_run:
                    break
        scheduler.step()

        model.eval()
        test_loss = 0.0
        with torch.no_grad():
            for data, target in test_loader:
                output = model(data)
                test_loss += F.nll_loss(output, target, reduction="sum").item()
                test_acc(output, target)
                if hparams.dry_run:
                    break
        test_loss = fabric.all_gather(test_loss).sum() / len(test_loader.dataset)
        accuracy = float(test_acc.compute())
        print(f"\nTest set: Average loss: {test_loss:.4f}, Accuracy: ({100 * accuracy:.0f}%)\n")
        test_acc.reset()
        report = {"epoch": epoch, "test_loss": float(test_loss), "accuracy": accuracy,
                  "lr": scheduler.get_last_lr()[0], "device": str(fabric.device),
                  "param_device": str(next(model.parameters()).device)}
        if hparams.dry_run:
            break
    if hparams.save_model:
        fabric.save("mnist_cnn.pt", {"model": model})
    return {**report, "losses": losses}


def main() -> None:
    parser = argparse.ArgumentParser(description="Fabric MNIST example on HPU")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=14)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--dry-run", action="store_true", default=False)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=10)
    parser.add_argument("--save-model", action="store_true", default=False)
    parser.add_argument("--train-samples", type=int, default=60000)
    parser.add_argument("--test-samples", type=int, default=10000)
    hparams = parser.parse_args()
    print("RESULT " + json.dumps(run(hparams)), flush=True)


if __name__ == "__main__":
    main()

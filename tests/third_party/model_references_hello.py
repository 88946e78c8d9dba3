import habana_frameworks.torch.core as htcore  # first line, as Habana's Model-References examples start

# A training script written the way Habana's Model-References examples are (PyTorch/examples/computer_vision/
# hello_world): `import habana_frameworks.torch.core as htcore` before torch, `torch.device("hpu")`,
# `htcore.mark_step()` after `loss.backward()` and after `optimizer.step()`, and in lazy mode evaluation through an
# HPU graph (`wrap_in_hpu_graph`). Written for hpu_nb's tests, not copied: MNIST-shaped synthetic data stands in for
# MNIST (no download). It knows nothing of hpu_nb. Prints one JSON line: per-epoch mean training loss, test accuracy.

import argparse
import json

import torch
import torch.nn as nn
import torch.nn.functional as F


class SimpleModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(784, 256)
        self.fc2 = nn.Linear(256, 64)
        self.fc3 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x.view(-1, 28 * 28)
        out = F.relu(self.fc1(out))
        out = F.relu(self.fc2(out))
        return self.fc3(out)


def mnist_like(n: int, seed: int) -> torch.utils.data.TensorDataset:
    """Ten classes of 28x28 images, each class a noisy copy of its own random template."""
    gen = torch.Generator().manual_seed(seed)
    templates = torch.rand(10, 1, 28, 28, generator=torch.Generator().manual_seed(1234))
    targets = torch.randint(0, 10, (n,), generator=gen)
    images = templates[targets] + 0.5 * torch.randn(n, 1, 28, 28, generator=gen)
    return torch.utils.data.TensorDataset(images, targets)


def train(net: nn.Module, criterion: nn.Module, optimizer: torch.optim.Optimizer, loader: torch.utils.data.DataLoader,
          device: torch.device) -> float:
    net.train()
    total = 0.0
    for batch_idx, (data, targets) in enumerate(loader):
        data, targets = data.to(device), targets.to(device)
        optimizer.zero_grad()
        loss = criterion(net(data), targets)
        loss.backward()
        htcore.mark_step()
        optimizer.step()
        htcore.mark_step()
        total += loss.item()
    return total / (batch_idx + 1)


def test(net: nn.Module, loader: torch.utils.data.DataLoader, device: torch.device) -> float:
    net.eval()
    correct = seen = 0
    with torch.no_grad():
        for data, targets in loader:
            data, targets = data.to(device), targets.to(device)
            outputs = net(data)
            htcore.mark_step()
            correct += outputs.argmax(1).eq(targets).sum().item()
            seen += targets.size(0)
    return correct / seen


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("hpu")
    train_loader = torch.utils.data.DataLoader(mnist_like(1024, seed=0), batch_size=args.batch_size, shuffle=True)
    test_loader = torch.utils.data.DataLoader(mnist_like(512, seed=1), batch_size=128, shuffle=False)

    net = SimpleModel().to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    losses = [train(net, criterion, optimizer, train_loader, device) for _ in range(args.epochs)]

    eval_net = net
    if htcore.is_lazy():  # HPU graphs exist in lazy mode; eager-mode code uses torch.compile instead
        import habana_frameworks.torch.hpu as hthpu

        eval_net = hthpu.wrap_in_hpu_graph(net)
    accuracy = test(eval_net, test_loader, device)
    print(json.dumps({"lazy": htcore.is_lazy(), "losses": losses, "test_acc": accuracy,
                      "device": str(next(net.parameters()).device),
                      "graphed": hasattr(eval_net, "clear_cache")}))  # Habana's API on a graph-wrapped module


if __name__ == "__main__":
    main()

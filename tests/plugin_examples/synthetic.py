"""Synthetic stand-ins for the datasets lightning-habana's examples download (MNIST, WikiText-2).

Same shapes and types as the real ones, made from a seeded generator, learnable (labels come from a fixed random
teacher), and small: the examples run in the test suite on the emulated Gaudi without a network.
"""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

IMAGE_SHAPE = (1, 28, 28)
CLASSES = 10


def mnist_like(samples: int, seed: int = 0) -> TensorDataset:
    """(image, label) pairs shaped as torchvision's MNIST after ToTensor + Normalize: float 1x28x28, int64 label."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(samples, *IMAGE_SHAPE, generator=generator)
    teacher = torch.randn(IMAGE_SHAPE[1] * IMAGE_SHAPE[2], CLASSES, generator=torch.Generator().manual_seed(1234))
    labels = (images.flatten(1) @ teacher).argmax(dim=1)
    return TensorDataset(images, labels)


class MNISTLikeDataModule(L.LightningDataModule):
    """What lightning's demos MNISTDataModule gives (train / val / test loaders of MNIST batches), synthesised."""

    def __init__(self, batch_size: int = 32, train_samples: int = 256, eval_samples: int = 64) -> None:
        super().__init__()
        self.batch_size, self.train_samples, self.eval_samples = batch_size, train_samples, eval_samples

    def train_dataloader(self) -> DataLoader:
        return DataLoader(mnist_like(self.train_samples, seed=1), batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(mnist_like(self.eval_samples, seed=2), batch_size=self.batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(mnist_like(self.eval_samples, seed=3), batch_size=self.batch_size)


class TokenStream(Dataset):
    """What lightning's demos WikiText2 gives: (input, target) windows of token ids, target shifted by one."""

    def __init__(self, vocab_size: int = 64, tokens: int = 2048, block_size: int = 16, seed: int = 0) -> None:
        self.vocab_size, self.block_size = vocab_size, block_size
        self.data = torch.randint(vocab_size, (tokens,), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.data) // self.block_size - 1

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.block_size
        chunk = self.data[start:start + self.block_size + 1]
        return chunk[:-1], chunk[1:]

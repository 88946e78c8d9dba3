import habana_frameworks.torch.core as htcore  # first line, as lightning-habana's examples start

# The flows of lightning-habana's examples/pytorch/hpu_graphs.py (HPU graphs with PyTorch Lightning), rewritten for
# hpu_nb's tests rather than copied: the same modes (training with capture-and-replay, make_graphed_callables and
# ModuleCacher; inference with capture-and-replay and wrap_in_hpu_graph; dynamic control flow and dynamic ops split
# into several cached graphs around `htcore.mark_step()`), the same Lightning calls (HPUAccelerator, SingleHPUStrategy,
# manual optimization), on MNIST-shaped synthetic data instead of MNIST. Where the example imports lightning_habana,
# this script imports the same names from hpu_nb. Run in lazy mode (HPU graphs are lazy-mode only, as on a Gaudi).
# Prints one JSON object: per flow, the training losses or the test accuracy (and the accuracy without graphs).

import argparse
import json
import random

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.pytorch import LightningModule, Trainer, seed_everything
from torch.utils.data import DataLoader, TensorDataset

from hpu_nb import HPUAccelerator, SingleHPUStrategy

BATCH = 200
STEPS = 10


def mnist_like(n: int, seed: int) -> TensorDataset:
    """Ten classes of 1x28x28 images, each a noisy copy of its class's random template."""
    gen = torch.Generator().manual_seed(seed)
    templates = torch.rand(10, 1, 28, 28, generator=torch.Generator().manual_seed(1234))
    targets = torch.randint(0, 10, (n,), generator=gen)
    return TensorDataset(templates[targets] + 0.5 * torch.randn(n, 1, 28, 28, generator=gen), targets)


def loader(seed: int, batches: int = STEPS) -> DataLoader:
    return DataLoader(mnist_like(batches * BATCH, seed), batch_size=BATCH)


class Classifier(nn.Module):
    """784 -> 128 -> 10 with log-probabilities out (the example's network, without its dropout and eye-matmul)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(784, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.fc2(F.relu(self.fc1(torch.flatten(x, 1)))), dim=1)


class GraphsFlow(LightningModule):
    """One LightningModule per flow; `flow` picks the training / test step as the example's NetHPUGraphs does."""

    def __init__(self, flow: str = "automatic") -> None:
        super().__init__()
        self.flow = flow
        self.net = Classifier()
        self.losses: list[float] = []
        self.accuracies: list[float] = []
        if flow in ("capture_and_replay_train", "capture_and_replay_test"):
            self.graph = htcore.hpu.HPUGraph()
            self.static_x = torch.zeros(BATCH, 1, 28, 28, device="hpu")
            self.static_y = torch.zeros(BATCH, dtype=torch.long, device="hpu")
            self.static_out: torch.Tensor | None = None
            self.automatic_optimization = flow != "capture_and_replay_train"
        elif flow == "dynamic_ops":
            self.automatic_optimization = False
            self.tail = nn.Identity()
            htcore.hpu.ModuleCacher(max_graphs=10)(model=self.net, inplace=True)
            htcore.hpu.ModuleCacher(max_graphs=10)(model=self.tail, inplace=True)
        elif flow == "dynamic_control_flow":
            self.automatic_optimization = False
            self.branches = nn.ModuleList([nn.Identity(), nn.Tanh()])
            self.choice = random.Random(0)
            for module in (self.net.fc1, *self.branches, self.net.fc2):
                htcore.hpu.ModuleCacher(max_graphs=10)(model=module, inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        step = {"capture_and_replay_train": self._capture_and_replay_step, "dynamic_ops": self._dynamic_ops_step,
                "dynamic_control_flow": self._dynamic_control_flow_step}.get(self.flow, self._automatic_step)
        loss = step(*batch)
        self.losses.append(loss.item())
        self.log("train_loss", loss)
        return loss

    def _automatic_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.nll_loss(self(x), y)

    def _capture_and_replay_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Warm up once, capture forward + backward + step once, then replay on new data copied into the inputs."""
        optimizer = self.optimizers()
        self.static_x.copy_(x)
        self.static_y.copy_(y)
        if self.global_step == 0:
            optimizer.zero_grad(set_to_none=True)
            loss = F.nll_loss(self(self.static_x), self.static_y)
            loss.backward()
            optimizer.step()
            return loss
        if self.static_out is None:
            optimizer.zero_grad(set_to_none=True)
            with htcore.hpu.graph(self.graph):
                self.static_out = F.nll_loss(self(self.static_x), self.static_y)
                self.static_out.backward()
                optimizer.step()
            return self.static_out
        self.graph.replay()
        return self.static_out

    def _dynamic_ops_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """A data-dependent op between two cached graphs, each side of it closed with mark_step()."""
        optimizer = self.optimizers()
        optimizer.zero_grad(set_to_none=True)
        log_probs = self.net(x)
        htcore.mark_step()
        kept = log_probs[torch.where(log_probs < 0)]  # a shape known only from the data
        htcore.mark_step()
        loss = F.nll_loss(self.tail(kept).reshape(x.shape[0], 10), y)
        self.manual_backward(loss)
        optimizer.step()
        return loss

    def _dynamic_control_flow_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Python control flow picks one of two graphs per step; each branch is its own cached graph."""
        optimizer = self.optimizers()
        optimizer.zero_grad(set_to_none=True)
        hidden = F.relu(self.net.fc1(torch.flatten(x, 1)))
        hidden = self.branches[self.choice.randrange(2)](hidden)
        loss = F.nll_loss(F.log_softmax(self.net.fc2(hidden), dim=1), y)
        self.manual_backward(loss)
        optimizer.step()
        return loss

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        if self.flow == "capture_and_replay_test":
            self.static_x.copy_(x)
            if self.static_out is None:
                self.graph.capture_begin()
                self.static_out = self(self.static_x)
                self.graph.capture_end()
            else:
                htcore.mark_step()
                self.graph.replay()
            predicted = self.static_out.argmax(-1)
        else:
            predicted = self(x).argmax(-1)
        accuracy = (predicted == y).float().mean()
        self.accuracies.append(accuracy.item())
        self.log("test_acc", accuracy)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adadelta(self.parameters(), lr=1.0)


def trainer() -> Trainer:
    return Trainer(accelerator=HPUAccelerator(), devices=1, strategy=SingleHPUStrategy(), max_epochs=1, logger=False,
                   enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


def train(flow: str) -> dict:
    seed_everything(42, verbose=False)
    model = GraphsFlow(flow)
    fitted: nn.Module = model
    if flow == "make_graphed_callables":
        model.to(torch.device("hpu"))
        fitted = htcore.hpu.make_graphed_callables(model, (torch.randn(BATCH, 1, 28, 28, device="hpu"),))
    elif flow == "modulecacher":
        fitted = htcore.hpu.ModuleCacher(max_graphs=10)(model=model, inplace=True)
    trainer().fit(fitted, loader(seed=0))
    return {"losses": model.losses}


def infer(flow: str) -> dict:
    """Test an untrained model through graphs, and the same weights without them: the accuracies must agree."""
    seed_everything(42, verbose=False)
    model = GraphsFlow(flow)
    reference = GraphsFlow("automatic")
    reference.net.load_state_dict(model.net.state_dict())
    tested: nn.Module = model
    if flow == "wrap_in_hpu_graph":
        tested = htcore.hpu.wrap_in_hpu_graph(model.to(torch.device("hpu")), asynchronous=False,
                                              disable_tensor_cache=True)
    trainer().test(tested, loader(seed=1, batches=4), verbose=False)
    trainer().test(reference, loader(seed=1, batches=4), verbose=False)
    return {"accuracies": model.accuracies, "reference": reference.accuracies}


def main() -> None:
    parser = argparse.ArgumentParser(description="HPU graphs with PyTorch Lightning, on synthetic data.")
    parser.add_argument("--train", nargs="*", default=["automatic", "capture_and_replay_train",
                                                       "make_graphed_callables", "modulecacher"])
    parser.add_argument("--inference", nargs="*", default=["capture_and_replay_test", "wrap_in_hpu_graph"])
    parser.add_argument("--dynamicity", nargs="*", default=["dynamic_control_flow", "dynamic_ops"])
    args = parser.parse_args()
    results = {flow: train(flow) for flow in [*args.train, *args.dynamicity]}
    results.update({flow: infer(flow) for flow in args.inference})
    results["lazy"] = htcore.is_lazy()
    print(json.dumps(results))


if __name__ == "__main__":
    main()

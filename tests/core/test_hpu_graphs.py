"""HPU graphs (lazy mode): wrap_in_hpu_graph, HPUGraph capture/replay, make_graphed_callables, ModuleCacher.

Rewritten from the behaviours lightning-habana's test_hpu_graphs asserts: every graph mode trains / evaluates through a
LightningModule, and its results agree with the model run without graphs. Here they agree exactly: the emulated Gaudi
runs the same ops (capture records them, replay runs them again on the static tensors).
"""

from __future__ import annotations

import warnings

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

BATCH = 32


@pytest.fixture
def lazy(monkeypatch):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")


def blobs(n: int = 4 * BATCH, seed: int = 0) -> DataLoader:
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=gen)
    x = torch.randn(n, 16, generator=gen) * 0.5 + F.one_hot(y, 16).float() * 2
    return DataLoader(TensorDataset(x, y), batch_size=BATCH)


class Net(L.LightningModule):
    """The plugin's NetHPUGraphs, without dropout (randomness would make runs differ, graphs or not)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)
        self.losses: list[float] = []

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.nll_loss(self(x), y)
        self.losses.append(loss.item())
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self(x).argmax(-1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.3, momentum=0.9)


class CaptureReplayNet(Net):
    """Manual optimization: warm up on batch 0, capture the whole step on batch 1, replay it afterwards."""

    def __init__(self) -> None:
        super().__init__()
        import habana_frameworks.torch.core as htcore

        self.automatic_optimization = False
        self.g = htcore.hpu.HPUGraph()
        self.static_x = torch.zeros(BATCH, 16, device="hpu")
        self.static_y = torch.zeros(BATCH, dtype=torch.long, device="hpu")
        self.static_loss = None

    def training_step(self, batch, batch_idx):
        import habana_frameworks.torch.core as htcore

        x, y = batch
        self.static_x.copy_(x)
        self.static_y.copy_(y)
        optimizer = self.optimizers()
        if self.global_step == 0:  # warm-up: optimizer state exists before the capture
            optimizer.zero_grad(set_to_none=True)
            loss = F.nll_loss(self(self.static_x), self.static_y)
            self.manual_backward(loss)
            optimizer.step()
        elif self.static_loss is None:  # capture (the captured step runs once, as it is recorded)
            optimizer.zero_grad(set_to_none=True)
            with htcore.hpu.graph(self.g):
                self.static_loss = F.nll_loss(self(self.static_x), self.static_y)
                self.static_loss.backward()
                optimizer.optimizer.step()
            loss = self.static_loss
        else:
            self.g.replay()  # new data was copied into the static inputs
            loss = self.static_loss
        self.losses.append(loss.item())
        return loss


def fit(model: L.LightningModule, epochs: int = 3, val: bool = True) -> L.Trainer:
    L.seed_everything(42, verbose=False)
    trainer = L.Trainer(accelerator="hpu", devices=1, max_epochs=epochs, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, blobs(), blobs(seed=1) if val else None)
    return trainer


def baseline() -> Net:
    torch.manual_seed(0)
    model = Net()
    fit(model)
    return model


def same_start(model: Net) -> Net:
    torch.manual_seed(0)
    reference = Net()
    model.load_state_dict(reference.state_dict())
    return model


def test_capture_and_replay_trains_as_the_model_without_graphs(lazy):
    expected = baseline()
    model = same_start(CaptureReplayNet())
    fit(model)
    assert len(model.losses) == len(expected.losses) == 12 and len(model.g._ops) > 20
    torch.testing.assert_close(model.losses, expected.losses, rtol=1e-5, atol=1e-6)
    assert expected.losses[-1] < expected.losses[0] * 0.8  # it learns
    for got, want in zip(model.parameters(), expected.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["make_graphed_callables", "modulecacher", "wrap_in_hpu_graph"])
def test_graphed_modules_train_and_evaluate_as_without_graphs(lazy, mode):
    import habana_frameworks.torch.core as htcore

    expected = baseline()
    model = same_start(Net()).to("hpu")
    if mode == "make_graphed_callables":
        model = htcore.hpu.make_graphed_callables(model, (torch.randn(BATCH, 16, device="hpu"),))
    elif mode == "modulecacher":
        model = htcore.hpu.ModuleCacher(max_graphs=10)(model=model, inplace=True)
    else:
        model = htcore.hpu.wrap_in_hpu_graph(model, asynchronous=False, disable_tensor_cache=True)
        model.clear_cache()  # Habana's API on a wrapped module
    trainer = fit(model)
    torch.testing.assert_close(model.losses, expected.losses, rtol=1e-5, atol=1e-6)
    assert trainer.callback_metrics["val_acc"] > 0.9


def test_inference_with_capture_and_replay(lazy):
    import habana_frameworks.torch.core as htcore

    model = baseline().to("hpu").eval()
    x, _ = next(iter(blobs(seed=1)))
    static_x = torch.zeros_like(x, device="hpu")
    g = htcore.hpu.HPUGraph()
    with torch.no_grad():
        g.capture_begin()
        static_out = model(static_x)
        g.capture_end()
        for xb, _ in blobs(seed=1):
            static_x.copy_(xb)
            g.replay()
            torch.testing.assert_close(static_out, model(xb.to("hpu")))


def test_replay_refuses_new_shapes(lazy):
    import habana_frameworks.torch.hpu as hthpu

    a = torch.ones(4, device="hpu")
    g = hthpu.HPUGraph()
    g.capture_begin()
    b = a.nonzero()  # a data-dependent shape: not replayable
    g.capture_end()
    a.zero_()
    with pytest.raises(RuntimeError, match="static shapes"):
        g.replay()
    assert b.shape == (4, 1)


def test_graphs_need_lazy_mode_as_on_a_gaudi(monkeypatch):
    import habana_frameworks.torch.hpu as hthpu

    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    with pytest.raises(AttributeError, match="HPU graphs run in lazy mode only.*hpu_backend"):
        hthpu.wrap_in_hpu_graph  # noqa: B018


def test_the_emulated_gaudi_says_once_that_no_graph_is_captured(lazy, monkeypatch):
    from habana_frameworks.torch.hpu import graphs

    monkeypatch.setattr(graphs, "_said", False)
    import habana_frameworks.torch.hpu as hthpu

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hthpu.wrap_in_hpu_graph(torch.nn.Linear(2, 2))
        hthpu.make_graphed_callables(torch.nn.Linear(2, 2), (torch.ones(1, 2),))
        g = hthpu.HPUGraph()
        with hthpu.graph(g):
            torch.ones(2, device="hpu").add_(1)
    said = [w for w in caught if issubclass(w.category, graphs.HPUGraphEmulationWarning)]
    assert len(said) == 1 and "captures no HPU graph" in str(said[0].message)


def test_on_the_fake_gaudi_the_module_calls_habana(make_fake_gaudi):
    fake = make_fake_gaudi()  # its release runs in lazy mode
    import habana_frameworks.torch.core as htcore

    expected = baseline()
    model = htcore.hpu.wrap_in_hpu_graph(same_start(Net()).to("hpu"), disable_tensor_cache=True)
    fit(model)
    assert fake.calls.count("wrap_in_hpu_graph") == 1
    assert fake.calls.named("wrap_in_hpu_graph")[0].kwargs == {"disable_tensor_cache": True}
    torch.testing.assert_close(model.losses, expected.losses, rtol=1e-5, atol=1e-6)

"""hpu_nb.plan: the planned peak against the emulated card's own counters, the FLOPs against the analytic count,
the card's counters untouched by planning, and clear errors for steps fake tensors cannot run."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import Trainer
from torch._subclasses.fake_tensor import is_fake
from typing_extensions import override

import hpu_nb
from hpu_nb.core.fp8 import convert_modules
from hpu_nb.emulator.fp8.training import fp8_traced_layout
from hpu_nb.plan import Plan, PlanError, plan_batch_sizes
from hpu_nb.runtime import get_backend
from hpu_nb.runtime.generations import GENERATIONS
from tests.plan.measure import measured_peak
from tests.plan.models import (
    CNN,
    MLP,
    CheckpointedTransformer,
    Transformer,
    TransformerConfig,
    analytic_flops,
    batches,
)


def _agrees(kind: str, model_class: type, precision: str) -> None:
    batch = batches(kind, 16)
    planned = hpu_nb.plan(model_class(), batch, precision=precision)
    gc.collect()
    measured = measured_peak(model_class(), batch, precision=precision)
    assert 0.95 <= planned.peak_bytes / measured <= 1.05, (planned.breakdown, measured)


@pytest.mark.parametrize(("kind", "model_class", "precision"), [("mlp", MLP, "32-true"), ("cnn", CNN, "bf16-mixed")])
def test_planned_peak_matches_the_emulated_cards_max_in_use(kind: str, model_class: type, precision: str) -> None:
    _agrees(kind, model_class, precision)


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_planned_transformer_peak_matches_the_emulated_cards_max_in_use(precision: str) -> None:
    _agrees("transformer", Transformer, precision)


@pytest.mark.parametrize(("kind", "model_class"), [("mlp", MLP), ("transformer", Transformer)])
def test_fp8_traced_as_the_emulated_card_holds_it_matches_its_max_in_use(kind: str, model_class: type) -> None:
    """The fp8 layers run on fake tensors (no scale or amax read): in the emulated card's layout the trace counts what
    the card allocates for fp8 (float32 operands, reused work tensors, the scaling state), byte for byte but for the
    allocator's few bytes of constants."""
    batch = batches(kind, 16)
    with fp8_traced_layout("emulated"):
        planned = hpu_nb.plan(model_class(), batch, precision="fp8")
    gc.collect()
    measured = measured_peak(model_class(), batch, precision="fp8")
    assert 0.999 <= planned.peak_bytes / measured <= 1.001, (planned.breakdown, measured)


def test_an_fp8_plan_counts_a_gaudis_one_byte_operands_and_the_fp8_gemms() -> None:
    """By default a plan counts what a Gaudi holds: 1-byte fp8 copies saved for backward where the emulated card keeps
    float32 ones, so less than the emulated layout; the fp8 GEMMs do the work the float32 ones do; the notes say so.
    (fp8 is the plugin's: fp8_autocast only, every other op in float32.)"""
    batch = batches("transformer", 16)
    gaudi = hpu_nb.plan(Transformer(), batch, precision="fp8")
    with fp8_traced_layout("emulated"):
        emulated = hpu_nb.plan(Transformer(), batch, precision="fp8")
    fp32 = hpu_nb.plan(Transformer(), batch, precision="32-true")
    assert gaudi.peak_bytes < emulated.peak_bytes
    assert gaudi.breakdown["activations"] < fp32.breakdown["activations"]  # 1-byte saved operands, not 4-byte ones
    assert gaudi.flops_per_step == fp32.flops_per_step
    assert any("1-byte fp8" in note for note in gaudi.notes)


def test_a_model_with_its_own_fp8_layers_comes_back_without_fake_tensors() -> None:
    model = MLP()
    convert_modules(model, replace_layers=True)
    hpu_nb.plan(model, batches("mlp", 4), precision="fp8")
    layers = [m for m in model.modules() if hasattr(m, "amax_history")]
    assert layers
    for layer in layers:
        assert "_traced_work" not in layer.__dict__
        assert not any(is_fake(t) for t in [*layer.parameters(), *layer.buffers()])
    trainer = Trainer(accelerator="hpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, plugins=[hpu_nb.HPUPrecisionPlugin("fp8")])
    trainer.fit(model, torch.utils.data.DataLoader([batches("mlp", 4)] * 2, batch_size=None))
    # it trained in fp8, eagerly: the second step folded the first one's amaxes into the history and rescaled
    assert all(int(layer.steps) == 1 and not torch.equal(layer.scale.cpu(), torch.ones(3)) for layer in layers)


def test_activation_checkpointing_is_planned_as_the_card_holds_it() -> None:
    """Blocks re-run in backward (torch.utils.checkpoint, non-reentrant, early stop): the recomputed tensors are counted
    while they live, as on the card, whenever Python's garbage collector runs."""
    batch = batches("transformer", 16)
    gc.disable()  # the plan must not depend on when gc runs: nothing it counts may wait for it
    try:
        planned = hpu_nb.plan(CheckpointedTransformer(), batch, precision="bf16-mixed")
    finally:
        gc.enable()
    measured = measured_peak(CheckpointedTransformer(), batch, precision="bf16-mixed")
    assert 0.99 <= planned.peak_bytes / measured <= 1.01, (planned.breakdown, measured)


def test_planning_never_touches_the_cards_memory_counters() -> None:
    backend = get_backend()
    gc.collect()  # what earlier tests left on the card is freed now, not while planning
    before = backend.memory_stats()
    result = hpu_nb.plan(Transformer(), batches("transformer", 8), precision="bf16-mixed")
    assert result.peak_bytes > 0
    assert backend.memory_stats() == before


def test_the_model_comes_back_as_it_was() -> None:
    model = MLP()
    params = {name: p for name, p in model.named_parameters()}
    values = {name: p.detach().clone() for name, p in params.items()}
    model.eval()
    hpu_nb.plan(model, batches("mlp", 4), precision="bf16-mixed")
    assert {name: p for name, p in model.named_parameters()} == params
    assert all(torch.equal(p, values[name]) and p.grad is None for name, p in model.named_parameters())
    assert not model.training


def test_flops_per_step_match_the_dense_transformer_count() -> None:
    cfg = TransformerConfig(vocab=256, d_model=256, layers=4, heads=4, ffn=1024, seq=129)
    with torch.device("meta"):
        model = Transformer(cfg)
    batch = torch.randint(0, cfg.vocab, (4, cfg.seq))
    result = hpu_nb.plan(model, batch, precision="bf16-mixed")
    expected = analytic_flops(model, 4)
    assert abs(result.flops_per_step / expected - 1) <= 0.05, (result.flops_per_step, expected)


def test_a_meta_model_is_planned_without_its_memory() -> None:
    cfg = TransformerConfig(vocab=32000, d_model=2048, layers=4, heads=16, ffn=5504, seq=256, llama=True)
    with torch.device("meta"):
        model = Transformer(cfg)
    result = hpu_nb.plan(model, torch.zeros(2, cfg.seq, dtype=torch.long), precision="bf16-mixed")
    params = sum(p.numel() for p in model.parameters())
    assert result.breakdown["parameters"] == 4 * params  # float32 weights, traced where none were allocated
    assert result.breakdown["optimizer_state"] >= 8 * params  # AdamW's two states
    assert result.fits and result.hbm_bytes == GENERATIONS["gaudi2"].hbm_bytes


def test_the_peak_grows_with_the_batch_and_largest_batch_fits_with_the_margin() -> None:
    plans = plan_batch_sizes(Transformer(), batches("transformer", 4), [2, 4, 8], precision="bf16-mixed",
                             generation="gaudi2")
    peaks = [p.peak_bytes for p in plans]
    assert peaks == sorted(peaks) and peaks[0] < peaks[-1]
    small = GENERATIONS["gaudi2"]
    first = plans[0]
    largest = first.largest_batch(margin=0.1)
    budget = small.hbm_bytes * 0.9
    assert first.at_batch_size(largest).peak_bytes <= budget < first.at_batch_size(largest + 1).peak_bytes


def test_strategies_shard_what_their_rules_say() -> None:
    cfg = TransformerConfig(vocab=4096, d_model=512, heads=8, ffn=2048)  # tensors above ZeRO-3's persistence threshold
    with torch.device("meta"):
        model = Transformer(cfg)
    batch = torch.zeros(8, cfg.seq, dtype=torch.long)
    single = hpu_nb.plan(model, batch, precision="bf16-mixed")
    ddp = hpu_nb.plan(model, batch, precision="bf16-mixed", devices=2)
    fsdp = hpu_nb.plan(model, batch, precision="bf16-mixed", devices=4, strategy="fsdp")
    zero3 = hpu_nb.plan(model, batch, precision="bf16-mixed", devices=8, strategy="deepspeed_stage_3")
    assert ddp.breakdown["communication"] == single.breakdown["parameters"]  # one bucket copy of every gradient
    assert fsdp.breakdown["optimizer_state"] == single.breakdown["optimizer_state"] // 4
    elements = sum(p.numel() for p in model.parameters())
    assert fsdp.breakdown["communication"] == 2 * 2 * elements  # no wrap policy: the whole model gathered in bf16
    persistent = sum(p.numel() for p in model.parameters() if p.numel() < 100_000)  # kept whole by every card
    sharded = sum(p.numel() for p in model.parameters()) - persistent
    assert zero3.breakdown["parameters"] == 2 * sharded // 8 + 2 * persistent  # bf16 engine weights
    assert "modelled" in zero3.method and "traced" in single.method
    offload = hpu_nb.plan(model, batch, precision="bf16-mixed", devices=8, strategy="deepspeed_stage_3_offload")
    assert offload.host_bytes > zero3.host_bytes and offload.peak_bytes < zero3.peak_bytes


def test_deepspeed_rule_is_deepspeeds_own_estimator() -> None:
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    from hpu_nb.plan.sharding import deepspeed_model_states

    psi, largest, n = 7_000_000_000, 131_072_000, 8
    for offload in (False, True):
        states, _ = deepspeed_model_states(psi, largest, n, 2, low_precision=True, optimizer_states=2.0,
                                           offload_optimizer=offload)
        assert sum(states.values()) == estimate_zero2_model_states_mem_needs(psi, n, 1, cpu_offload=offload)[1]
        states, _ = deepspeed_model_states(psi, largest, n, 3, low_precision=True, optimizer_states=2.0,
                                           offload_optimizer=offload, offload_parameters=offload)
        assert sum(states.values()) == estimate_zero3_model_states_mem_needs(
            psi, largest, n, 1, cpu_offload=offload, cpu_offload_params=offload)[1]


def test_text_says_it_is_an_estimate_and_where_the_figures_come_from() -> None:
    result = hpu_nb.plan(MLP(), batches("mlp", 4), precision="bf16-mixed", generation="gaudi3")
    text = str(result)
    assert "estimate" in text and "Hot Chips 2024" in text and "MFU" in text
    assert isinstance(result, Plan) and "Gaudi3" in repr(result)
    low, high = result.step_time_s
    assert 0 < low <= high
    first = hpu_nb.plan.with_generation(result, "gaudi")  # the same trace against the first-generation card
    assert first.peak_bytes == result.peak_bytes and first.step_time_s[0] > low  # slower HBM and MME
    assert result.fits_on("gaudi") and first.hbm_bytes < result.hbm_bytes


class _ItemStep(MLP):
    @override
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        scale = x.abs().max().item()
        return F.cross_entropy(self(x / scale), y)


class _NonzeroStep(MLP):
    @override
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        keep = torch.nonzero(y)
        return F.cross_entropy(self(x[keep[:, 0]]), y[keep[:, 0]])


@pytest.mark.parametrize(("model_class", "words", "line"), [
    (_ItemStep, "reads a tensor's value", "scale = x.abs().max().item()"),
    (_NonzeroStep, "shape depends on values", "keep = torch.nonzero(y)"),
])
def test_a_step_fake_tensors_cannot_run_gets_the_op_and_line(model_class: type, words: str, line: str) -> None:
    with pytest.raises(PlanError) as caught:
        hpu_nb.plan(model_class(), batches("mlp", 4))
    message = str(caught.value)
    assert words in message and "test_plan.py" in message and line in message
    assert "emulated card" in message


def test_a_custom_op_without_a_meta_kernel_is_named() -> None:
    lib = torch.library.Library("hpu_nb_plan_test", "DEF")
    lib.define("opaque(Tensor x) -> Tensor")
    lib.impl("opaque", lambda x: x.clone(), "CPU")  # a CPU kernel only: no shape rule

    class Opaque(MLP):
        @override
        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
            x, y = batch
            return F.cross_entropy(self(torch.ops.hpu_nb_plan_test.opaque(x)), y)

    with pytest.raises(PlanError, match="hpu_nb_plan_test.opaque") as caught:
        hpu_nb.plan(Opaque(), batches("mlp", 4))
    assert "register_fake" in str(caught.value) and "test_plan.py" in str(caught.value)


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="precision"):
        hpu_nb.plan(MLP(), batches("mlp", 4), precision="64")
    with pytest.raises(ValueError, match="fp8"):
        hpu_nb.plan(MLP(), batches("mlp", 4), precision="fp8", generation="gaudi")
    with pytest.raises(ValueError, match="fp8 is not available with the fsdp strategy"):
        hpu_nb.plan(MLP(), batches("mlp", 4), precision="fp8", devices=2, strategy="fsdp")
    with pytest.raises(ValueError, match="strategy"):
        hpu_nb.plan(MLP(), batches("mlp", 4), strategy="megatron")
    with pytest.raises(TypeError, match="check_val_every_n_epoch"):
        hpu_nb.plan(MLP(), batches("mlp", 4), check_val_every_n_epoch=2)
    with pytest.raises(TypeError, match="LightningModule"):
        hpu_nb.plan(torch.nn.Linear(2, 2), batches("mlp", 4))


def test_a_dataloader_or_datamodule_gives_its_first_batch() -> None:
    from lightning.pytorch import LightningDataModule
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.randn(12, 256), torch.randint(0, 10, (12,)))

    class Data(LightningDataModule):
        def train_dataloader(self) -> DataLoader:
            return DataLoader(data, batch_size=6)

    from_tensors = hpu_nb.plan(MLP(), batches("mlp", 6))
    assert hpu_nb.plan(MLP(), DataLoader(data, batch_size=6)).peak_bytes == from_tensors.peak_bytes
    assert hpu_nb.plan(MLP(), Data()).batch_size == 6


def test_a_trainer_config_is_planned_from_its_trainer_kwargs() -> None:
    from hpu_nb import TrainerConfig

    config = TrainerConfig(devices=2, strategy="deepspeed", deepspeed_stage=3, precision="bf16-mixed")
    result = hpu_nb.plan(MLP(), batches("mlp", 4), **config.trainer_kwargs())
    assert result.strategy == "DeepSpeed ZeRO-3 × 2" and result.precision == "bf16-mixed"


def test_tripwire_the_private_pieces_the_plan_leans_on() -> None:
    """Fails loudly when a torch or Lightning upgrade moves what hpu_nb.plan uses: Lightning's optimizer normaliser
    (_configure_optimizers), MemTracker's peak bookkeeping (_update_peak_stats, _curr_mem_snap, _peak_mem_snap,
    _update_and_maybe_create_winfos) and FlopCounterMode's module tracker (mod_tracker: the step's total reads its
    parents)."""
    import inspect

    from lightning.pytorch.core.optimizer import _configure_optimizers
    from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker
    from torch.utils.flop_counter import FlopCounterMode

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    assert _configure_optimizers({"optimizer": optimizer})[0] == [optimizer]
    assert list(inspect.signature(MemTracker._update_peak_stats).parameters) == ["self", "peak_state"]
    source = inspect.getsource(MemTracker._update_peak_stats)
    assert "_curr_mem_snap" in source and "_peak_mem_snap" in source and "_peak_mem" in source
    assert _TOTAL_KEY == "Total"
    winfos = inspect.signature(MemTracker._update_and_maybe_create_winfos)
    assert list(winfos.parameters)[:3] == ["self", "t", "reftype"]
    assert hasattr(FlopCounterMode(display=False), "mod_tracker")
    assert "self.mod_tracker.parents" in inspect.getsource(FlopCounterMode._count_flops)
    assert "self.mod_tracker.__enter__()" in inspect.getsource(FlopCounterMode.__enter__)

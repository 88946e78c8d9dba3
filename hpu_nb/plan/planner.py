"""hpu_nb.plan: will a training run fit on a Gaudi, how fast might a step be, on how many cards -- before renting one.

The step is the user's own (training_step, backward, configure_optimizers' optimizer), traced on fake `hpu` tensors
(hpu_nb.plan.fake_step) under the precision's forward rules (autocast on "hpu" with Habana's op lists, as
hpu_nb.core.mixed_precision runs it; fp8 through core's fp8 layers); the strategy's sharding is modelled from that
trace (hpu_nb.plan.sharding); the card's size, bandwidth and peaks come from hpu_nb.runtime.generations. Every
figure is an estimate and says how it was obtained; the step time is a roofline bound with an assumed MFU band.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from hpu_nb.plan.fake_step import CATEGORIES, PlanError, StepTrace, batch_size_of, first_batch, trace_step
from hpu_nb.plan.sharding import StrategyModel, per_card, strategy_model
from hpu_nb.runtime.generations import (
    ALLOCATOR_GRANULARITY_BYTES,
    GENERATIONS,
    PLANNER_FACTS_SOURCE,
    Generation,
    generation_from_name,
)

__all__ = ["BREAKDOWN_KEYS", "DEFAULT_MARGIN", "DEFAULT_MFU_BAND", "Plan", "PlanError", "plan", "plan_batch_sizes"]

BREAKDOWN_KEYS = (*CATEGORIES, "communication")
# The MFU band a step-time estimate assumes: large dense transformer training on Gaudi 2 reaches roughly this band of
# the bf16 peak in Habana's published training results (an assumption, stated with every estimate; pass mfu=...).
DEFAULT_MFU_BAND = (0.3, 0.6)
DEFAULT_MARGIN = 0.1  # largest_batch() keeps this share of the HBM free (graph workspace, allocator slack, HCCL)
_PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "fp8")


@dataclass
class Plan:
    """What one card holds and does in one training step, estimated from a traced step. All bytes per card."""

    generation: Generation
    precision: str
    strategy: str  # how users read it: "DeepSpeed ZeRO-3 × 8"
    devices: int
    num_nodes: int
    batch_size: int  # per card, as the DataLoader gives it
    breakdown: dict[str, int]  # BREAKDOWN_KEYS -> bytes at the peak
    host_bytes: int  # what lives in host memory (offloaded optimizer / parameters, the optimizer's step counters)
    flops_per_step: int  # per card, forward + backward (torch FlopCounterMode)
    traffic_bytes: int  # per card, the step's unfused memory traffic
    communication_bytes: int  # per card, what its collectives send in one step (modelled)
    step_time_s: tuple[float, float]  # (low, high): a roofline bound, an estimate
    mfu_band: tuple[float, float]
    method: str  # traced / modelled, and by which rule
    notes: list[str] = field(default_factory=list)
    _replan: Callable[[int], Plan] | None = field(default=None, repr=False, compare=False)
    _cache: dict[int, Plan] = field(default_factory=dict, repr=False, compare=False)

    @property
    def peak_bytes(self) -> int:
        """The per-card peak: the breakdown's sum at the traced peak."""
        return sum(self.breakdown.values())

    @property
    def hbm_bytes(self) -> int:
        return self.generation.hbm_bytes

    @property
    def fits(self) -> bool:
        """Whether the peak fits the card's HBM (with no margin: see largest_batch for one)."""
        return self.peak_bytes <= self.hbm_bytes

    @property
    def world_size(self) -> int:
        return self.devices * self.num_nodes

    def fits_on(self, generation: str | Generation) -> bool:
        """Whether this per-card peak fits another generation's HBM (the same step: the peak does not change)."""
        gen = generation if isinstance(generation, Generation) else generation_from_name(generation)
        return self.peak_bytes <= gen.hbm_bytes

    # -- batch sizes ---------------------------------------------------------------------------------------------
    def at_batch_size(self, size: int) -> Plan:
        """The same plan for a per-card batch of `size` (traced again; remembered)."""
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"batch size must be a positive int, got {size!r}.")
        if size == self.batch_size:
            return self
        if size not in self._cache:
            if self._replan is None:
                raise RuntimeError("this Plan was not made by hpu_nb.plan(): it cannot be traced again.")
            self._cache[size] = self._replan(size)
        return self._cache[size]

    def sweep(self, sizes: Iterable[int]) -> list[Plan]:
        """Plans for each per-card batch size in `sizes`."""
        return [self.at_batch_size(size) for size in sizes]

    def largest_batch(self, margin: float = DEFAULT_MARGIN, *, limit: int = 1 << 20) -> int:
        """The largest per-card batch whose planned peak stays within (1 - margin) of the card's HBM; 0 if even a
        batch of 1 does not. The peak grows about linearly with the batch: two traces predict it, traces confirm
        it (the answer fits and one more does not), and a bisection takes over where the line was off."""
        if not 0 <= margin < 1:
            raise ValueError(f"margin must be in [0, 1), got {margin!r}.")
        budget = self.hbm_bytes * (1 - margin)

        def fits(size: int) -> bool:
            return self.at_batch_size(size).peak_bytes <= budget

        if not fits(1):
            return 0
        second = self.batch_size if self.batch_size > 1 else 2
        first_peak, second_peak = self.at_batch_size(1).peak_bytes, self.at_batch_size(second).peak_bytes
        slope = (second_peak - first_peak) / (second - 1)
        guess = limit if slope <= 0 else int(1 + (budget - first_peak) // slope)
        guess = max(1, min(limit, guess))
        low, high = 1, None  # low fits; high does not
        if fits(guess):
            low = guess
            step = 1
            while low < limit:
                probe = min(limit, low + step)
                if not fits(probe):
                    high = probe
                    break
                low, step = probe, step * 2
            if high is None:
                return low
        else:
            high = guess
        while high - low > 1:
            middle = (low + high) // 2
            if fits(middle):
                low = middle
            else:
                high = middle
        return low

    # -- text ----------------------------------------------------------------------------------------------------
    def summary_rows(self) -> list[tuple[str, str]]:
        """(label, value) rows: what the text and HTML views show."""
        low, high = self.step_time_s
        rows = [
            ("card", f"{self.generation.label} ({_gib(self.hbm_bytes)} HBM)"),
            ("strategy", f"{self.strategy}, {self.world_size} card(s) ({self.devices} × {self.num_nodes} node(s))"),
            ("precision", self.precision),
            ("batch per card", str(self.batch_size)),
            ("peak per card", f"{_gib(self.peak_bytes)} ({100 * self.peak_bytes / self.hbm_bytes:.0f}% of HBM): "
                              f"{'fits' if self.fits else 'DOES NOT FIT'}"),
        ]
        rows += [(f"  {key.replace('_', ' ')}", _gib(value)) for key, value in self.breakdown.items()]
        if self.host_bytes >= 1 << 20:  # offloaded state; a few bytes of optimizer step counters are not worth a row
            rows.append(("host memory", _gib(self.host_bytes)))
        rows += [
            ("FLOPs per step per card", f"{self.flops_per_step:.3e}"),
            ("step time (estimate)", f"{_seconds(low)} – {_seconds(high)} (roofline bound, MFU "
                                     f"{self.mfu_band[0]:.0%}–{self.mfu_band[1]:.0%} assumed)"),
            ("method", self.method),
        ]
        return rows

    def to_text(self) -> str:
        width = max(len(label) for label, _ in self.summary_rows())
        lines = ["hpu_nb.plan — an estimate, traced on fake tensors (no Gaudi used)"]
        lines += [f"{label.ljust(width)}  {value}" for label, value in self.summary_rows()]
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"Plan({self.generation.label}, {self.strategy}, {self.precision}, batch {self.batch_size}: peak "
                f"{_gib(self.peak_bytes)} of {_gib(self.hbm_bytes)} per card, {'fits' if self.fits else 'does not fit'}"
                f", step {_seconds(self.step_time_s[0])}–{_seconds(self.step_time_s[1])} estimated)")

    def __str__(self) -> str:
        return self.to_text()


def _gib(value: float) -> str:
    """Bytes in the unit that reads best (GiB from 1 GiB on, else MiB / KiB / B)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(value) >= size:
            return f"{value / size:.2f} {unit}"
    return f"{int(value)} B"


def _seconds(value: float) -> str:
    if value >= 1:
        return f"{value:.2f} s"
    return f"{value * 1e3:.3g} ms"


# -- the step time: a roofline bound ---------------------------------------------------------------------------------
def step_time_range(generation: Generation, precision: str, flops: int, traffic: int, communication: int,
                    mfu_band: tuple[float, float]) -> tuple[float, float]:
    """(low, high) seconds: compute at the band's high / low MFU of the published peak, the unfused memory traffic at
    the peak HBM bandwidth, the collectives at the card's NIC bandwidth; low assumes all three overlap, high that
    the collectives do not overlap the rest."""
    peak = generation.peak_flops(precision)
    if peak <= 0 or generation.hbm_bandwidth_bytes_per_s <= 0:
        return (math.nan, math.nan)
    memory = traffic / generation.hbm_bandwidth_bytes_per_s
    comm = communication / generation.nic_bytes_per_s if generation.nic_bytes_per_s else 0.0
    fast = flops / (peak * mfu_band[1])
    slow = flops / (peak * mfu_band[0])
    return (max(fast, memory, comm), max(slow, memory) + comm)


def _communication_bytes(model: StrategyModel, trace: StepTrace, compute_bytes: int) -> int:
    """What one card sends per step: a ring all-reduce of the gradients (DDP, ZeRO-1/2: reduce-scatter +
    all-gather), or all-gathering the parameters twice and reduce-scattering the gradients (ZeRO-3, FSDP)."""
    n = model.world_size
    if n == 1:
        return 0
    share = (n - 1) / n
    if model.kind == "ddp":
        return int(2 * share * trace.trainable_bytes)
    gradient_bytes = trace.param_elements * compute_bytes
    if model.kind == "fsdp" or model.stage == 3:
        return int(3 * share * gradient_bytes)
    return int(2 * share * gradient_bytes)


# -- the public functions --------------------------------------------------------------------------------------------
def plan(
    model: nn.Module,
    batch: Any,
    *,
    devices: int = 1,
    num_nodes: int = 1,
    strategy: Any = "auto",
    precision: str | int = "32-true",
    generation: str | Generation = "gaudi2",
    mfu: tuple[float, float] = DEFAULT_MFU_BAND,
    batch_size: int | None = None,
    **trainer_kwargs: Any,
) -> Plan:
    """Plan a training run on Gaudi: trace the model's training step on fake `hpu` tensors and report, per card, the
    peak memory and its breakdown, whether it fits, the FLOPs and a step-time estimate.

    Args:
        model: a LightningModule (built anywhere: on the meta device, `with torch.device("meta"): model = M()`,
            it needs no host memory). It is given back as it was.
        batch: one batch of CPU tensors (the per-card batch), a DataLoader or a LightningDataModule.
        devices / num_nodes / strategy / precision: as the Trainer takes them (strategy: a name or a strategy).
        generation: "gaudi", "gaudi2" or "gaudi3" (or a Generation): whose HBM and peaks to plan against.
        mfu: the (low, high) model FLOPs utilisation the step-time estimate assumes.
        batch_size: plan this per-card batch size instead of the given batch's.
        trainer_kwargs: other Trainer arguments (`hpu_nb.plan(model, batch, **config.trainer_kwargs())` plans a
            TrainerConfig); `accumulate_grad_batches` and `gradient_clip_val` change nothing in the per-step peak
            (noted); a precision plugin in `plugins` gives the precision; arguments the plan cannot account for are
            refused with their name.
    """
    from hpu_nb.core.precision_names import validate_precision  # noqa: PLC0415 -- lazy: Lightning

    gen = generation if isinstance(generation, Generation) else generation_from_name(str(generation))
    for plugin in _as_list(trainer_kwargs.pop("plugins", None)):  # e.g. TrainerConfig's HPUPrecisionPlugin("fp8")
        if isinstance(getattr(plugin, "precision", None), str):
            precision = plugin.precision
    unified = validate_precision(precision, check_device=False)
    if unified not in _PRECISIONS:
        raise ValueError(f"precision={precision!r} cannot be planned; choose one of {', '.join(_PRECISIONS)}.")
    if unified == "16-mixed" and not gen.supports_fp16:
        raise ValueError(gen.fp16_support()[1])
    if unified == "fp8" and not gen.supports_fp8:
        raise ValueError(gen.fp8_support()[1])
    low, high = mfu
    if not 0 < low <= high <= 1:
        raise ValueError(f"mfu must be (low, high) with 0 < low <= high <= 1, got {mfu!r}.")
    notes = _trainer_kwargs_notes(trainer_kwargs)
    sharding = strategy_model(strategy, devices, num_nodes)
    if sharding.kind == "fsdp":  # the run would refuse it (fp8 is not among FSDP's precisions): so does the plan
        from hpu_nb.core.strategy_parts.fsdp import fsdp_issues  # noqa: PLC0415 -- lazy: Lightning

        for issue in fsdp_issues(precision=unified):
            raise ValueError(f"precision={precision!r} cannot be planned with strategy={strategy!r}: {issue.message}")
    one_batch = first_batch(batch)
    size = batch_size if batch_size is not None else batch_size_of(one_batch)

    def make(size: int) -> Plan:
        return _make_plan(model, one_batch, size, sharding, unified, gen, (low, high), notes, devices, num_nodes)

    result = make(size)
    result._replan = make
    return result


def plan_batch_sizes(model: nn.Module, batch: Any, sizes: Iterable[int], **kwargs: Any) -> list[Plan]:
    """hpu_nb.plan at each per-card batch size in `sizes` (the same arguments as plan): a batch-size sweep."""
    sizes = list(sizes)
    if not sizes:
        raise ValueError("sizes is empty: give the per-card batch sizes to plan, e.g. [8, 16, 32].")
    first = plan(model, batch, batch_size=sizes[0], **kwargs)
    return [first, *(first.at_batch_size(size) for size in sizes[1:])]


_NEUTRAL_KWARGS = {
    "accumulate_grad_batches": "gradient accumulation keeps the same gradients: the per-step peak is unchanged",
    "gradient_clip_val": "gradient clipping adds small temporaries (the norms): not traced",
    "gradient_clip_algorithm": "gradient clipping adds small temporaries (the norms): not traced",
    "max_epochs": None, "max_steps": None, "logger": None, "enable_progress_bar": None, "callbacks": None,
    "log_every_n_steps": None, "enable_checkpointing": None, "accelerator": None, "default_root_dir": None,
    "profiler": "a profiler's host-side buffers are not device memory", "enable_model_summary": None,
    "num_sanity_val_steps": None, "limit_train_batches": None, "limit_val_batches": None,
}


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _trainer_kwargs_notes(trainer_kwargs: dict[str, Any]) -> list[str]:
    notes = []
    for name, value in trainer_kwargs.items():
        if name not in _NEUTRAL_KWARGS:
            raise TypeError(f"hpu_nb.plan() got Trainer argument {name}={value!r}, which it cannot plan for (it plans "
                            f"devices, num_nodes, strategy, precision and {', '.join(sorted(_NEUTRAL_KWARGS))}).")
        if name == "accelerator" and str(value) not in ("hpu", "auto") and not hasattr(value, "setup_device"):
            raise ValueError(f"accelerator={value!r}: hpu_nb.plan plans Gaudi ('hpu') runs.")
        if _NEUTRAL_KWARGS[name]:
            notes.append(f"{name}={value!r}: {_NEUTRAL_KWARGS[name]}.")
    return notes


def _make_plan(model: nn.Module, batch: Any, size: int, sharding: StrategyModel, precision: str, gen: Generation,
               mfu: tuple[float, float], notes: list[str], devices: int, num_nodes: int) -> Plan:
    from hpu_nb.core.fp8 import fp8_autocast  # noqa: PLC0415 -- lazy: torch, Lightning
    from hpu_nb.core.mixed_precision import autocast_context  # noqa: PLC0415
    from hpu_nb.runtime import get_backend  # noqa: PLC0415

    device = get_backend().root_device()
    param_dtype = None
    context = precision  # the precision plugins' forward context: autocast_context(precision)
    if sharding.kind == "deepspeed" and precision != "32-true":
        # DeepSpeed's engine holds 2-byte weights and casts its inputs (Lightning's DeepSpeedPrecision); fp8 runs its
        # fp8 layers under fp8 autocast and the rest in bf16 (hpu_nb.core.strategies.deepspeed_precision).
        param_dtype = torch.float16 if precision == "16-mixed" else torch.bfloat16
        context = "32-true"  # no autocast: the weights themselves are 2-byte

    def forward() -> contextlib.AbstractContextManager[Any]:
        if precision == "fp8" and sharding.kind == "deepspeed":  # bf16 weights: fp8 autocast without bf16 autocast
            return fp8_autocast(enabled=True)
        return autocast_context(context)

    notes = list(notes)
    prepare: Callable[[nn.Module], nn.Module] | None = None
    if precision == "fp8":
        # As HPUPrecisionPlugin("fp8", replace_layers=True): nn.Linear swapped for the device's fp8 layers before the
        # optimizers are made, the step under fp8 autocast (and bf16 autocast; DeepSpeed: bf16 weights instead).
        # On fake tensors the fp8 layers read no scale or amax and allocate as Habana's transformer engine holds fp8
        # (hpu_nb.emulator.fp8.training's module doc says what that is and where the emulated card differs).
        prepare = _with_fp8_layers
        notes.append("fp8: nn.Linear layers traced as fp8 layers holding what a Gaudi's transformer engine holds "
                     "(1-byte fp8 copies of their inputs, weights and gradients saved for backward, outputs in the "
                     "activation dtype); the emulated card keeps float32 copies and reuses work tensors between "
                     "steps, so it measures more (benchmarks/bench_plan.py prints both). Their delayed-scaling "
                     "history is counted as buffers; its per-step update (a few bytes) is not traced.")
    trace = trace_step(model, batch, device=device, forward_context=forward, scale_loss=precision == "16-mixed",
                       param_dtype=param_dtype, prepare=prepare, batch_size=size)
    compute_bytes = 4 if precision == "32-true" else 2
    breakdown, host, method = per_card(trace, sharding, compute_bytes)
    if precision == "fp8":
        method += "; fp8 layers with a Gaudi's 1-byte operands"
    breakdown = {key: int(breakdown.get(key, 0)) for key in BREAKDOWN_KEYS}
    communication = _communication_bytes(sharding, trace, compute_bytes)
    all_notes = [
        *notes,
        f"Gaudi figures: {PLANNER_FACTS_SOURCE}.",
        "Not known without a card: the graph compiler's workspace, HCCL's own buffers and how Habana's allocator "
        "rounds allocations" + ("" if ALLOCATOR_GRANULARITY_BYTES is None else
                                f" ({ALLOCATOR_GRANULARITY_BYTES} B granules)") +
        " (not published): keep a margin (largest_batch keeps 10%).",
    ]
    if precision == "32-true":
        all_notes.append("32-true: the step time uses the bf16 matrix peak, so it is a lower bound for float32.")
    return Plan(
        generation=gen, precision=precision, strategy=sharding.label, devices=devices, num_nodes=num_nodes,
        batch_size=size, breakdown=breakdown, host_bytes=host, flops_per_step=trace.flops,
        traffic_bytes=trace.traffic_bytes, communication_bytes=communication,
        step_time_s=step_time_range(gen, precision, trace.flops, trace.traffic_bytes, communication, mfu),
        mfu_band=mfu, method=method, notes=all_notes,
    )


def _with_fp8_layers(module: nn.Module) -> nn.Module:
    """The model as HPUPrecisionPlugin("fp8", replace_layers=True) trains it: nn.Linear swapped for fp8 layers."""
    from hpu_nb.core.fp8 import convert_modules  # noqa: PLC0415 -- lazy: Lightning

    return convert_modules(module, replace_layers=True)


def generations() -> dict[str, Generation]:
    """Every generation a plan can be made for (the HBM lines of the view)."""
    return dict(GENERATIONS)


def with_generation(result: Plan, generation: str | Generation) -> Plan:
    """The same traced step against another generation's card (HBM, peaks): no new trace."""
    gen = generation if isinstance(generation, Generation) else generation_from_name(str(generation))
    step = step_time_range(gen, result.precision, result.flops_per_step, result.traffic_bytes,
                           result.communication_bytes, result.mfu_band)
    return replace(result, generation=gen, step_time_s=step, _replan=None, _cache={})

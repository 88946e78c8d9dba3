"""What each card holds under a strategy, from one card's traced step: the strategies' own sharding rules.

Single card: the trace is the card. DDP, DeepSpeed ZeRO and FSDP are modelled from the traced step (activations,
temporaries and the batch stay per card: each card runs its own batch) and the rules of the library that does the
sharding, named at each rule; no process is started. What a rule models is said in the plan's `method`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpu_nb.plan.fake_step import StepTrace

__all__ = ["StrategyModel", "per_card", "strategy_model"]

_SINGLE = {"single", "hpu_single", "single_device"}
_DDP = {"ddp", "hpu_ddp", "hpu_parallel", "ddp_spawn", "ddp_fork", "ddp_notebook", "hpu_ddp_spawn"}
_FSDP = {"fsdp", "hpu_fsdp"}


@dataclass(frozen=True)
class StrategyModel:
    """The sharding a strategy does: kind "single" / "ddp" / "deepspeed" / "fsdp", over `world_size` cards."""

    kind: str
    world_size: int
    stage: int = 0  # DeepSpeed ZeRO stage
    offload_optimizer: bool = False
    offload_parameters: bool = False
    shard_parameters: bool = True  # FSDP: FULL_SHARD (True) or SHARD_GRAD_OP (False)
    wrapped_blocks: bool = False  # FSDP: an auto_wrap_policy wraps each block; without one the model is one unit
    # DeepSpeed's buffers: Lightning's DeepSpeedStrategy defaults (contiguous_gradients, overlap_comm,
    # reduce_bucket_size=2e8) and DeepSpeed's stage-3 param_persistence_threshold (1e5: smaller tensors stay whole)
    reduce_bucket_size: int = 200_000_000
    overlap_comm: bool = True
    contiguous_gradients: bool = True
    persistence_threshold: int = 100_000

    @property
    def label(self) -> str:
        if self.kind == "deepspeed":
            offload = " + offload " + ("parameters, optimizer" if self.offload_parameters else "optimizer") \
                if self.offload_optimizer or self.offload_parameters else ""
            return f"DeepSpeed ZeRO-{self.stage}{offload} × {self.world_size}"
        if self.kind == "fsdp":
            return f"FSDP {'FULL_SHARD' if self.shard_parameters else 'SHARD_GRAD_OP'} × {self.world_size}"
        if self.kind == "ddp":
            return f"DDP × {self.world_size}"
        return "single card"


def strategy_model(strategy: Any, devices: int, num_nodes: int) -> StrategyModel:
    """The StrategyModel of a Trainer `strategy` (a registered name or a strategy object) on devices × num_nodes."""
    if not isinstance(devices, int) or isinstance(devices, bool) or devices < 1:
        raise ValueError(f"devices must be a positive int (cards per node), got {devices!r}.")
    if not isinstance(num_nodes, int) or isinstance(num_nodes, bool) or num_nodes < 1:
        raise ValueError(f"num_nodes must be a positive int, got {num_nodes!r}.")
    world = devices * num_nodes
    if isinstance(strategy, str):
        name = strategy.strip().lower()
        if name == "auto":
            return StrategyModel("single" if world == 1 else "ddp", world)
        if name in _SINGLE:
            if world != 1:
                raise ValueError(f"strategy={strategy!r} runs on one card, but devices × num_nodes = {world}.")
            return StrategyModel("single", 1)
        if name in _DDP:
            return StrategyModel("ddp", world)
        if name in _FSDP:
            return StrategyModel("fsdp", world)
        deepspeed = name.removeprefix("hpu_")
        if deepspeed == "deepspeed":
            return StrategyModel("deepspeed", world, stage=2)  # Lightning's DeepSpeedStrategy default
        if deepspeed.startswith("deepspeed_stage_"):
            rest = deepspeed.removeprefix("deepspeed_stage_")
            stage_text, _, offload = rest.partition("_")
            if stage_text in ("1", "2", "3") and offload in ("", "offload"):
                stage = int(stage_text)
                return StrategyModel("deepspeed", world, stage=stage, offload_optimizer=bool(offload),
                                     offload_parameters=bool(offload) and stage == 3)
        raise ValueError(
            f"strategy={strategy!r} cannot be planned. Choose 'auto', 'single', 'ddp', 'fsdp', 'deepspeed', "
            "'deepspeed_stage_1', 'deepspeed_stage_2', 'deepspeed_stage_2_offload', 'deepspeed_stage_3', "
            "'deepspeed_stage_3_offload' (with or without the 'hpu_' prefix), or pass a strategy object."
        )
    return _model_of_object(strategy, world)


def _model_of_object(strategy: Any, world: int) -> StrategyModel:
    from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy  # noqa: PLC0415

    if isinstance(strategy, DeepSpeedStrategy):
        zero = dict((strategy.config or {}).get("zero_optimization", {}) or {})
        stage = int(zero.get("stage", 0))
        offload_optimizer = (zero.get("offload_optimizer") or {}).get("device") in ("cpu", "nvme")
        offload_parameters = (zero.get("offload_param") or {}).get("device") in ("cpu", "nvme")
        return StrategyModel("deepspeed", world, stage=stage, offload_optimizer=offload_optimizer,
                             offload_parameters=offload_parameters and stage == 3,
                             reduce_bucket_size=int(zero.get("reduce_bucket_size", 200_000_000)),
                             overlap_comm=bool(zero.get("overlap_comm", True)),
                             contiguous_gradients=bool(zero.get("contiguous_gradients", True)),
                             persistence_threshold=int(zero.get("stage3_param_persistence_threshold", 100_000)))
    if isinstance(strategy, FSDPStrategy):
        kind = str(getattr(strategy, "sharding_strategy", "FULL_SHARD")).rsplit(".", 1)[-1].upper()
        if kind == "NO_SHARD":
            return StrategyModel("ddp", world)
        policy = getattr(strategy, "kwargs", {}).get("auto_wrap_policy")
        return StrategyModel("fsdp", world, shard_parameters=kind not in ("SHARD_GRAD_OP", "_HYBRID_SHARD_ZERO2"),
                             wrapped_blocks=policy is not None)
    if isinstance(strategy, DDPStrategy):
        return StrategyModel("ddp", world)
    if world == 1:
        return StrategyModel("single", 1)
    raise ValueError(f"strategy {type(strategy).__name__} cannot be planned: pass a DDP, DeepSpeed or FSDP strategy, "
                     "or a registered name.")


def per_card(trace: StepTrace, model: StrategyModel, compute_bytes: int) -> tuple[dict[str, int], int, str]:
    """(per-card breakdown with "communication", host bytes, how it was obtained) of `trace` under `model`.

    compute_bytes: bytes per element the step computes in (2 under bf16 / fp16 / fp8 autocast, 4 in float32).
    """
    per = dict(trace.breakdown)
    per["communication"] = 0
    host = trace.host_bytes
    n = model.world_size
    psi = trace.param_elements  # ZeRO-1 keeps whole gradients: DeepSpeed's estimator prices stages 1 and 2 alike
    if model.kind == "single":
        return per, host, "traced (fake hpu tensors, torch MemTracker)"
    if model.kind == "ddp":
        # torch DDP's Reducer keeps one flat bucket per ~25 MB of gradients, a copy of every gradient
        # (gradient_as_bucket_view=False: torch's and Lightning's default): the gradients' bytes once more.
        per["communication"] = trace.trainable_bytes
        return per, host, "traced step + DDP gradient buckets modelled (torch Reducer, gradient_as_bucket_view=False)"
    if model.kind == "fsdp":
        # torch FSDP (FULL_SHARD): parameters, gradients and optimizer state live sharded 1/N. A unit's parameters are
        # gathered in the compute dtype and its gradient is whole until reduce-scattered: two units' worth. Without an
        # auto_wrap_policy the whole model is one unit (Lightning's FSDPStrategy default); with one, each block is a
        # unit and the next is prefetched (three blocks' worth).
        per["parameters"] = per["parameters"] // n if model.shard_parameters else per["parameters"]
        per["gradients"] //= n
        per["optimizer_state"] //= n
        if model.wrapped_blocks:
            per["communication"] = 3 * trace.largest_block_elements * compute_bytes
            rule = "3 gathered blocks"
        else:
            per["communication"] = 2 * psi * compute_bytes
            rule = "the model one unit: its parameters gathered, its gradient whole"
        if not model.shard_parameters:
            per["communication"] = psi * compute_bytes  # SHARD_GRAD_OP: parameters stay whole; the gradient's unit
        return per, host, f"traced step + FSDP sharding modelled (1/N states, {rule})"
    return _deepspeed(per, host, trace, model, psi, n)


def deepspeed_model_states(psi: int, largest_layer: int, n: int, stage: int, *, low_precision: bool,
                           optimizer_states: float, offload_optimizer: bool = False,
                           offload_parameters: bool = False, persistent: int = 0) -> tuple[dict[str, int], int]:
    """(per-card model-state bytes by category, host bytes): DeepSpeed's own estimators' rule
    (deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs, stage3.estimate_zero3_...; they
    price stages 1 and 2 alike), with the optimizer's state count traced rather than assumed Adam's.

    Low precision (bf16 / fp16 engine): 2-byte parameters on every card (ZeRO-3: 1/N of them, plus the largest layer
    gathered with its gradient, DeepSpeed's "4 × largest_layer_params"); the partition each card owns holds its
    2-byte gradients (not in ZeRO-3, where they go with the gathered layer), 4-byte fp32 gradients, a 4-byte fp32
    master copy and 4 bytes per optimizer state (Adam: DeepSpeed's "18 × params / gpus"). In float32 the master copy
    is the parameters themselves and the gradients are 4-byte. Offloaded parts are host bytes. `persistent`: ZeRO-3's
    elements in tensors under param_persistence_threshold, which every card keeps whole (the estimators leave them out).
    """
    width = 2 if low_precision else 4
    states = round(4 * optimizer_states)
    if low_precision:
        partition = {"gradients": (4 + (0 if stage == 3 else 2)) * psi // n, "optimizer_state": (4 + states) * psi // n}
    else:
        partition = {"gradients": 4 * psi // n, "optimizer_state": states * psi // n}
    if stage == 3:
        sharded = psi - persistent
        cards = {"parameters": width * sharded // n + width * persistent, "communication": 2 * width * largest_layer}
    else:
        cards = {"parameters": width * psi, "communication": 0}
    cards.update({"gradients": 0, "optimizer_state": 0})
    host = 0
    if offload_optimizer or offload_parameters:
        host += sum(partition.values())
    else:
        for key, value in partition.items():
            cards[key] += value
    if offload_parameters and stage == 3:  # the partitions move to the host; persistent tensors stay on every card
        kept = width * persistent
        host += cards["parameters"] - kept
        cards["parameters"] = kept
    return cards, host


def deepspeed_buffers(model: StrategyModel, low_precision: bool) -> int:
    """The gradient-reduction buckets DeepSpeed allocates whatever the model's size (so they dominate a small model):
    ZeRO-1/2 with contiguous_gradients, one reduce_bucket_size buffer per gradient dtype, two with overlap_comm
    (deepspeed/runtime/zero/stage_1_and_2.py, setup_buckets: low-precision staging in ZeRO-2, fp32 in ZeRO-1);
    ZeRO-3 one reduce_bucket_size flat buffer (stage3.py, the ipg bucket)."""
    if model.stage == 3:
        return model.reduce_bucket_size * (2 if low_precision else 4)
    if not model.contiguous_gradients or model.stage == 0:
        return 0
    width = 2 if low_precision and model.stage == 2 else 4
    return (2 if model.overlap_comm else 1) * model.reduce_bucket_size * width


def _deepspeed(per: dict[str, int], host: int, trace: StepTrace, model: StrategyModel, psi: int,
               n: int) -> tuple[dict[str, int], int, str]:
    low = trace.trainable_bytes < 4 * psi  # the traced step held the engine's 2-byte weights
    persistent = sum(size for size in trace.param_sizes if size < model.persistence_threshold)
    states, extra_host = deepspeed_model_states(
        psi, trace.largest_module_elements, n, model.stage, low_precision=low,
        optimizer_states=trace.optimizer_states_per_element, offload_optimizer=model.offload_optimizer,
        offload_parameters=model.offload_parameters, persistent=persistent if model.stage == 3 else 0)
    states["communication"] += deepspeed_buffers(model, low)
    buffers = trace.breakdown["parameters"] - trace.trainable_bytes  # buffers (e.g. running stats) stay whole
    per.update(states)
    per["parameters"] += buffers
    if model.stage in (1, 2) and per["gradients"]:
        # ZeRO-1/2 make their gradient partitions when the buckets are reduced and free them after the optimizer step
        # (stage_1_and_2.py: averaged_gradients, the fp32 partition's grad): not alive at the activation peak. The
        # card's peak is the larger of the two moments.
        at_step = {**per, "activations": 0, "temporaries": 0}
        without = {**per, "gradients": 0}
        per = at_step if sum(at_step.values()) > sum(without.values()) else without
    return per, host + extra_host, (
        f"traced step (engine weights) + DeepSpeed ZeRO-{model.stage} model states modelled "
        "(DeepSpeed's estimate_zero2/3_model_states_mem_needs rule)")

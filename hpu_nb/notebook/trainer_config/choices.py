"""The Trainer form's vocabulary: the values each field accepts, the words the form shows for them, and the groups of
values the model's relevance, rules and plan speak of (one place, so the form and the model cannot disagree)."""

from __future__ import annotations

from hpu_nb.core.strategies.deepspeed import ZERO_STAGES

ACCELERATORS = ("hpu", "HPUAccelerator()")
STRATEGIES = ("auto", "single", "parallel", "ddp", "deepspeed", "fsdp")
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "fp8", "fp8-measure", "fp8-quantize")
AUTOCAST_STYLES = ("plugin", "context", "decorator")
DEEPSPEED_STAGES = ZERO_STAGES

STRATEGY_LABELS = {
    "auto": "auto (single for 1 device, parallel for more)",
    "single": "single device (hpu_single)",
    "parallel": "parallel / DDP over HCCL (hpu_parallel)",
    "ddp": "DDP (hpu_ddp)",
    "deepspeed": "DeepSpeed ZeRO (HPUDeepSpeedStrategy)",
    "fsdp": "FSDP (HPUFSDPStrategy)",
}
PRECISION_LABELS = {
    "32-true": "32-true (fp32)",
    "bf16-mixed": "bf16-mixed",
    "16-mixed": "16-mixed (fp16, Gaudi2+)",
    "fp8": "fp8 training (Gaudi2+)",
    "fp8-measure": "fp8 inference: 1. measure",
    "fp8-quantize": "fp8 inference: 2. quantize",
}
AUTOCAST_LABELS = {"plugin": "precision plugin", "context": "with torch.autocast", "decorator": "@torch.autocast"}

STRING_STRATEGIES = {"single": "hpu_single", "parallel": "hpu_parallel", "ddp": "hpu_ddp"}  # strategy= as a string
MIXED = ("bf16-mixed", "16-mixed")
FP8 = ("fp8", "fp8-measure", "fp8-quantize")
FP8_INFERENCE = ("fp8-measure", "fp8-quantize")
SETS_ITSELF = ("accelerator", "devices", "strategy", "precision", "plugins", "profiler", "callbacks")  # not in extra

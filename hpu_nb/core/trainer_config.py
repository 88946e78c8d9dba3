"""A Trainer configuration for HPU as plain data: validation, `trainer_kwargs()` and the equivalent Python `code`.

This is the model behind TrainerConfigWidget, kept free of widgets so it can be tested (and used) on its own.
The contract: executing `code` in a fresh namespace (plus `model` when fp8 needs to convert it) defines `trainer`
exactly as `L.Trainer(**cfg.trainer_kwargs(model))` would be built. Classes are named by their public `hpu_nb`
names, both in the code and when building the kwargs, so core never imports the notebook layer at import time.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field, fields, replace
from typing import Any, Iterable, Sequence, Union

from hpu_nb.runtime import get_backend

ACCELERATORS = ("hpu", "HPUAccelerator()")
STRATEGIES = ("auto", "single", "parallel", "ddp", "deepspeed", "fsdp")
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "fp8", "fp8-measure", "fp8-quantize")
AUTOCAST_STYLES = ("plugin", "context", "decorator")
DEEPSPEED_STAGES = (0, 1, 2, 3)

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
STRING_STRATEGIES = {"single": "hpu_single", "parallel": "hpu_parallel", "ddp": "hpu_ddp"}
MIXED = ("bf16-mixed", "16-mixed")
FP8 = ("fp8", "fp8-measure", "fp8-quantize")

OpList = Union[Sequence[str], str, None]  # op names, or the path of a LOWER_LIST-style file


@dataclass(frozen=True)
class Issue:
    """One validation finding, shown next to the field it concerns."""

    level: str  # "error" or "warning"
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.level}: {self.field}: {self.message}"


class InvalidConfigError(ValueError):
    """The configuration has errors; the message lists each one."""


@dataclass
class TrainerConfig:
    """The choices of a Trainer on HPU. Every field has a safe default; `issues()` says what is wrong."""

    accelerator: str = "hpu"
    devices: int = 1
    strategy: str = "auto"
    deepspeed_stage: int = 2
    offload_optimizer: bool = False
    precision: str = "32-true"
    autocast: str = "plugin"
    lower_list: OpList = None  # ops forced to bf16 / fp16 under autocast
    fp32_list: OpList = None  # ops kept in fp32 under autocast
    fp8_data_path: str = "fp8_data"
    profiler: bool = False
    monitor: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # more Trainer arguments, e.g. {"max_epochs": 3}

    # -- validation ---------------------------------------------------------------------------------------------
    def issues(self) -> list[Issue]:
        """Every error and warning for the current choices (cheap: runs on each click)."""
        out: list[Issue] = []

        def err(name: str, message: str) -> None:
            out.append(Issue("error", name, message))

        def warn(name: str, message: str) -> None:
            out.append(Issue("warning", name, message))

        for name, choices in (("accelerator", ACCELERATORS), ("strategy", STRATEGIES), ("precision", PRECISIONS),
                              ("autocast", AUTOCAST_STYLES)):
            if getattr(self, name) not in choices:
                err(name, f"{getattr(self, name)!r} is not one of: {', '.join(map(repr, choices))}.")
        if out:
            return out
        backend = get_backend()
        gen = backend.generation()
        self._check_devices(backend, err, warn)
        self._check_strategy(backend, gen, err, warn)
        self._check_precision(gen, err, warn)
        self._check_op_lists(err)
        if self.monitor and self.devices > 1:
            warn("monitor", "with several devices the chart shows the card of rank 0.")
        for key in self.extra:
            if key in ("accelerator", "devices", "strategy", "precision", "plugins", "profiler", "callbacks"):
                err("extra", f"{key!r} is set by the form; remove it from extra.")
        return out

    def _check_devices(self, backend: Any, err: Any, warn: Any) -> None:
        if isinstance(self.devices, bool) or not isinstance(self.devices, int) or self.devices < 1:
            err("devices", f"devices must be a whole number >= 1, got {self.devices!r}.")
            return
        available = backend.device_count()
        if self.devices > available:
            hint = " Set HPU_NB_DEVICE_COUNT to emulate more cards." if backend.is_emulated else ""
            err("devices", f"{self.devices} devices asked for, but only {available} are available "
                           f"({backend.describe()}).{hint}")

    def _check_strategy(self, backend: Any, gen: Any, err: Any, warn: Any) -> None:
        devices = self.devices if isinstance(self.devices, int) else 1
        if self.strategy == "single" and devices > 1:
            err("strategy", f"the single-device strategy runs on one HPU; choose parallel / DDP for {devices} devices.")
        if self.strategy in ("parallel", "ddp", "deepspeed", "fsdp") and devices == 1:
            warn("strategy", "one device: this strategy runs a single process; 'single' does the same with less set-up.")
        if self.strategy == "deepspeed":
            if importlib.util.find_spec("deepspeed") is None:
                err("strategy", "DeepSpeed is not installed: pip install 'hpu_nb[deepspeed]' (on a Gaudi, Habana's "
                                "DeepSpeed fork).")
            if self.deepspeed_stage not in DEEPSPEED_STAGES:
                err("deepspeed_stage", f"DeepSpeed ZeRO has stages 0, 1, 2 and 3, not {self.deepspeed_stage!r}.")
            elif self.offload_optimizer and self.deepspeed_stage == 0:
                err("offload_optimizer", "optimizer offload needs ZeRO stage 1, 2 or 3.")
            if self.deepspeed_stage == 3 and gen.key == "gaudi2":
                warn("deepspeed_stage", "ZeRO-3 was not supported on Gaudi2 up to SynapseAI 1.18.")
        elif self.offload_optimizer:
            warn("offload_optimizer", "optimizer offload applies to DeepSpeed only; ignored.")
        if self.strategy == "fsdp" and backend.is_lazy():
            err("strategy", "FSDP runs in eager mode only: set PT_HPU_LAZY_MODE=0 in the environment before Python "
                            "starts (for a notebook: in the kernel's environment), then restart the kernel.")

    def _check_precision(self, gen: Any, err: Any, warn: Any) -> None:
        if self.precision == "16-mixed" and not gen.supports_fp16:
            err("precision", f"fp16 is not supported on {gen.device_name}: it needs Gaudi2 or newer. Use bf16-mixed.")
        if self.precision in FP8:
            if not gen.supports_fp8:
                err("precision", f"fp8 is not supported on {gen.device_name}: it needs Gaudi2 or newer.")
            if self.strategy in ("deepspeed", "fsdp"):
                err("precision", f"fp8 is not available with the {self.strategy} strategy here; use single or "
                                 "parallel / DDP.")
            if self.autocast != "plugin":
                err("autocast", "fp8 runs through HPUPrecisionPlugin; choose the plugin autocast style.")
            if self.precision != "fp8" and not str(self.fp8_data_path).strip():
                err("fp8_data_path", "fp8 inference needs a directory for the measurements.")
            if self.precision == "fp8-quantize":
                warn("precision", "quantize after measuring, in a new process (restart the kernel after the "
                                  f"measurement run); the measurements are read from {self.fp8_data_path!r}.")
        if self.autocast != "plugin" and self.precision == "32-true":
            warn("autocast", "32-true has nothing to autocast; choose bf16-mixed or 16-mixed.")
        if self.autocast != "plugin" and self.precision in MIXED and self.strategy in ("deepspeed", "fsdp"):
            warn("autocast", f"{self.strategy} manages precision itself; autocast in your own code is on top of it.")

    def _check_op_lists(self, err: Any) -> None:
        if not (self.lower_list or self.fp32_list):
            return
        if self.precision not in MIXED:
            err("lower_list", "op lists act on bf16-mixed / 16-mixed autocast; choose one of them.")
            return
        if self.autocast != "plugin":
            err("lower_list", "op lists are applied by HPUPrecisionPlugin; choose the plugin autocast style "
                              "(or set LOWER_LIST / FP32_LIST before the process starts).")
        if self.strategy in ("deepspeed", "fsdp"):
            err("lower_list", f"the {self.strategy} precision plugin takes no op lists.")
        try:
            from hpu_nb.core.oplists import load_op_lists
        except ImportError:
            return
        try:
            load_op_lists(self.lower_list or None, self.fp32_list or None)
        except (ValueError, OSError) as problem:
            err("lower_list", str(problem))

    @property
    def errors(self) -> list[Issue]:
        return [i for i in self.issues() if i.level == "error"]

    @property
    def warnings(self) -> list[Issue]:
        return [i for i in self.issues() if i.level == "warning"]

    def check(self) -> None:
        """Raise InvalidConfigError listing every error (warnings do not raise)."""
        errors = self.errors
        if errors:
            raise InvalidConfigError("The Trainer configuration has errors:\n  " + "\n  ".join(map(str, errors)))

    # -- what it means ------------------------------------------------------------------------------------------
    @property
    def needs_model(self) -> bool:
        """fp8 converts the model before the Trainer uses it: the code refers to your `model`."""
        return self.precision in FP8

    @property
    def uses_plugin(self) -> bool:
        return self.precision in FP8 or (self.precision in MIXED and self.autocast == "plugin"
                                         and bool(self.lower_list or self.fp32_list))

    @property
    def trainer_precision(self) -> str | None:
        """The Trainer's `precision=` (None when a plugin instance carries it)."""
        if self.uses_plugin:
            return None
        if self.precision in MIXED and self.autocast != "plugin":
            return "32-true"  # autocast happens in the user's own code
        return self.precision

    def required_names(self) -> list[str]:
        """The hpu_nb classes the code and the kwargs use (each must exist in this installation)."""
        names = []
        if self.accelerator == "HPUAccelerator()":
            names.append("HPUAccelerator")
        if self.strategy == "deepspeed":
            names.append("HPUDeepSpeedStrategy")
        elif self.strategy == "fsdp":
            names.append("HPUFSDPStrategy")
        if self.uses_plugin:
            names.append("HPUPrecisionPlugin")
        if self.profiler:
            names.append("HPUProfiler")
        if self.monitor:
            names.append("MemoryMonitor")
        return names

    def _convert_call(self) -> tuple[str, dict[str, Any]] | None:
        """(comment, keyword arguments) of plugin.convert_modules for fp8, else None."""
        if self.precision == "fp8":
            return "fp8 training: swaps nn.Linear layers for fp8 ones", {"replace_layers": True}
        if self.precision == "fp8-measure":
            return ("fp8 inference step 1: measure on some data (trainer.predict), then restart and quantize",
                    {"inference": True, "quant": False, "fp8_data_path": self.fp8_data_path})
        if self.precision == "fp8-quantize":
            return ("fp8 inference step 2: quantize with the measurements (in a new process)",
                    {"inference": True, "quant": True, "fp8_data_path": self.fp8_data_path})
        return None

    def _plugin_kwargs(self) -> dict[str, Any]:
        precision = "fp8" if self.precision in FP8 else self.precision
        kwargs: dict[str, Any] = {"precision": precision}
        if self.precision in MIXED:
            if self.lower_list:
                kwargs["lower_list"] = _op_value(self.lower_list)
            if self.fp32_list:
                kwargs["fp32_list"] = _op_value(self.fp32_list)
        return kwargs

    def _strategy_kwargs(self) -> dict[str, Any]:
        return {"zero_optimization": True, "stage": self.deepspeed_stage, "offload_optimizer": self.offload_optimizer}

    # -- building -------------------------------------------------------------------------------------------------
    def build(self, model: Any = None) -> tuple[dict[str, Any], Any]:
        """(Trainer keyword arguments, the model to use). fp8 converts `model`, so it must be given then."""
        self.check()
        if self.needs_model and model is None:
            raise InvalidConfigError(
                f"precision={self.precision!r} converts your model's layers first: pass it, "
                "e.g. kwargs, model = cfg.build(model) or cfg.trainer_kwargs(model)."
            )
        hpu_nb = importlib.import_module("hpu_nb")
        kwargs: dict[str, Any] = {}
        kwargs["accelerator"] = hpu_nb.HPUAccelerator() if self.accelerator == "HPUAccelerator()" else "hpu"
        kwargs["devices"] = self.devices
        if self.strategy in STRING_STRATEGIES:
            kwargs["strategy"] = STRING_STRATEGIES[self.strategy]
        elif self.strategy == "deepspeed":
            kwargs["strategy"] = hpu_nb.HPUDeepSpeedStrategy(**self._strategy_kwargs())
        elif self.strategy == "fsdp":
            kwargs["strategy"] = hpu_nb.HPUFSDPStrategy()
        if self.trainer_precision is not None:
            kwargs["precision"] = self.trainer_precision
        if self.uses_plugin:
            plugin = hpu_nb.HPUPrecisionPlugin(**self._plugin_kwargs())
            convert = self._convert_call()
            if convert is not None:
                model = plugin.convert_modules(model, **convert[1])
            kwargs["plugins"] = [plugin]
        if self.profiler:
            kwargs["profiler"] = hpu_nb.HPUProfiler()
        if self.monitor:
            kwargs["callbacks"] = [hpu_nb.MemoryMonitor()]
        kwargs.update(self.extra)
        return kwargs, model

    def trainer_kwargs(self, model: Any = None) -> dict[str, Any]:
        """Keyword arguments for `L.Trainer(**cfg.trainer_kwargs())` (fp8: pass the model, converted in place)."""
        return self.build(model)[0]

    # -- code ------------------------------------------------------------------------------------------------------
    @property
    def code(self) -> str:
        """Python that defines `trainer` as trainer_kwargs() does; errors are listed on top as comments."""
        lines: list[str] = []
        errors = self.errors
        if errors:
            lines += ["# This configuration has errors; fix them first:"]
            lines += [f"#   - {i.field}: " + i.message.replace("\n", "\n#     ") for i in errors]
            lines.append("")
        names = self.required_names()
        lines.append("import lightning as L")
        if names:
            lines.append(f"from hpu_nb import {', '.join(sorted(set(names)))}")
        lines.append("")
        snippet = self._autocast_snippet()
        if snippet:
            lines += snippet + [""]
        if self.uses_plugin:
            lines.append(f"plugin = HPUPrecisionPlugin({_call_args(self._plugin_kwargs())})")
            convert = self._convert_call()
            if convert is not None:
                comment, kwargs = convert
                lines.append(f"model = plugin.convert_modules(model, {_call_args(kwargs)})  # {comment}")
            lines.append("")
        args: list[str] = []
        args.append("accelerator=HPUAccelerator()" if self.accelerator == "HPUAccelerator()" else 'accelerator="hpu"')
        args.append(f"devices={self.devices!r}")
        if self.strategy in STRING_STRATEGIES:
            args.append(f'strategy="{STRING_STRATEGIES[self.strategy]}"')
        elif self.strategy == "deepspeed":
            args.append(f"strategy=HPUDeepSpeedStrategy({_call_args(self._strategy_kwargs())})")
        elif self.strategy == "fsdp":
            args.append("strategy=HPUFSDPStrategy()")
        if self.trainer_precision is not None:
            args.append(f'precision="{self.trainer_precision}"')
        if self.uses_plugin:
            args.append("plugins=[plugin]")
        if self.profiler:
            args.append("profiler=HPUProfiler()")
        if self.monitor:
            args.append("callbacks=[MemoryMonitor()]")
        args += [f"{k}={v!r}" for k, v in self.extra.items()]
        lines.append("trainer = L.Trainer(")
        lines += [f"    {a}," for a in args]
        lines.append(")")
        return "\n".join(lines) + "\n"

    def _autocast_snippet(self) -> list[str]:
        if self.autocast == "plugin" or self.precision not in MIXED:
            return []
        dtype = "torch.bfloat16" if self.precision == "bf16-mixed" else "torch.float16"
        device = get_backend().autocast_device_type
        where = f"Gaudi autocasts on {device!r}"
        call = f'torch.autocast(device_type="{device}", dtype={dtype})'
        how = {"context": "a torch.autocast context", "decorator": "the @torch.autocast decorator"}[self.autocast]
        lines = [f"# {self.precision} with {how} in your LightningModule "
                 f"({where}); the Trainer itself stays in 32-true:", "#", "#     import torch", "#",
                 "#     class MyModel(L.LightningModule):"]
        if self.autocast == "context":
            lines += ["#         def forward(self, x):", f"#             with {call}:",
                      "#                 return self.net(x)"]
        else:
            lines += [f"#         @{call}", "#         def forward(self, x):", "#             return self.net(x)"]
        return lines

    # -- convenience -------------------------------------------------------------------------------------------
    def replace(self, **changes: Any) -> "TrainerConfig":
        return replace(self, **changes)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


def _op_value(value: OpList) -> Any:
    if isinstance(value, str):
        return value  # a file path
    return list(value or ())


def _call_args(kwargs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_literal(v)}" for k, v in kwargs.items())


def _literal(value: Any) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    return repr(value)


def parse_op_list(text: str) -> OpList:
    """What a user typed in an op-list field: a file path (contains '/' or ends in .txt), or op names."""
    text = (text or "").strip()
    if not text:
        return None
    if "/" in text or text.endswith(".txt") or text.startswith("."):
        return text
    names = [part for chunk in text.replace(";", ",").split(",") for part in chunk.split()]
    return [n for n in names if n]


def op_list_text(value: OpList) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return ", ".join(value)


def config_from(values: Iterable[tuple[str, Any]]) -> TrainerConfig:
    """A TrainerConfig from (field, value) pairs, with a clear error for an unknown field."""
    known = set(TrainerConfig.field_names())
    data = dict(values)
    unknown = sorted(set(data) - known)
    if unknown:
        raise TypeError(f"Unknown TrainerConfig field(s) {unknown}; known: {', '.join(sorted(known))}.")
    return TrainerConfig(**data)

"""TrainerConfig: the choices of a Trainer on HPU as plain data, which of them matter, what is wrong with them, and
the plan of calls they mean.

This is the model behind TrainerConfigWidget, kept free of widgets so it can be tested (and used) on its own. The
configuration rules are hpu_nb.core's validators; `issues()` maps this model's fields to their arguments. Which fields
matter depends on the others (`relevant()`): a field that does not matter is ignored, never an error, so the form
never shows an error that names a control it has disabled. `plan()` is the one description of the Trainer: `code`
renders it (render.py) and `build()` runs it (evaluate.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from hpu_nb.core.issues import Issue
from hpu_nb.core.oplists import load_op_lists
from hpu_nb.core.precision_rules import fp8_quantize_issues, generation_issues
from hpu_nb.core.strategies.deepspeed import deepspeed_issues
from hpu_nb.core.strategies.fsdp import fsdp_issues
from hpu_nb.notebook.trainer_config.choices import (
    ACCELERATORS,
    AUTOCAST_STYLES,
    FP8,
    FP8_INFERENCE,
    MIXED,
    PRECISIONS,
    SETS_ITSELF,
    STRATEGIES,
    STRING_STRATEGIES,
)
from hpu_nb.notebook.trainer_config.evaluate import run_plan
from hpu_nb.notebook.trainer_config.op_list_field import OpList, op_value
from hpu_nb.notebook.trainer_config.plan import Call, Plan, Ref, Statement, items
from hpu_nb.notebook.trainer_config.plan import required_names as plan_names
from hpu_nb.notebook.trainer_config.render import (
    autocast_snippet,
    keyword_problem,
    literal_problem,
    offload_snippet,
    plan_code,
    short_repr,
)
from hpu_nb.runtime import get_backend

# the validators' arguments, by the field of this form that sets them (the rules themselves live in hpu_nb.core)
VALIDATOR_FIELDS = {"stage": "deepspeed_stage", "deepspeed": "strategy"}


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
    offload_lr: float = 1e-3  # learning rate of DeepSpeedCPUAdam, the optimizer ZeRO-Offload needs
    extra: dict[str, Any] = field(default_factory=dict)  # more Trainer arguments, e.g. {"max_epochs": 3}

    # -- which fields matter ----------------------------------------------------------------------------------
    def relevant(self, name: str) -> bool:
        """Does `name` matter for the current choices? A field that does not is ignored (and its control disabled)."""
        if name == "deepspeed_stage":
            return self.strategy == "deepspeed"
        if name in ("offload_optimizer", "offload_lr"):
            return self.strategy == "deepspeed" and self.deepspeed_stage in (1, 2, 3) and (
                name == "offload_optimizer" or self.offload_optimizer)
        if name == "autocast":
            return self.precision in MIXED
        if name in ("lower_list", "fp32_list"):
            return self.precision in MIXED and self.autocast == "plugin" and self.strategy not in ("deepspeed", "fsdp")
        if name == "fp8_data_path":
            return self.precision in FP8_INFERENCE
        return True

    @property
    def offloads(self) -> bool:
        return self.relevant("offload_lr")

    @property
    def op_lists(self) -> bool:
        return self.relevant("lower_list") and bool(self.lower_list or self.fp32_list)

    # -- validation ---------------------------------------------------------------------------------------------
    def issues(self) -> list[Issue]:
        """Every error and warning for the current choices (cheap: runs on each click). Errors name relevant fields.

        The configuration rules are hpu_nb.core's validators (the ones the strategies and plugins raise with); this
        form only maps its fields to their arguments, and adds what is about the form itself (its choices, `extra`)
        or is advice for a notebook user (the op lists, the monitor, ZeRO-Offload's optimizer)."""
        out: list[Issue] = []

        def err(name: str, message: str) -> None:
            out.append(Issue(name, message, "error"))

        def warn(name: str, message: str) -> None:
            out.append(Issue(name, message, "warning"))

        for name, choices in (("accelerator", ACCELERATORS), ("strategy", STRATEGIES), ("precision", PRECISIONS),
                              ("autocast", AUTOCAST_STYLES)):
            if getattr(self, name) not in choices:
                err(name, f"{getattr(self, name)!r} is not one of: {', '.join(map(repr, choices))}.")
        if out:
            return out
        backend = get_backend()
        self._check_devices(backend, err)
        self._check_strategy(err, warn)
        out += self._core_issues(backend)
        self._check_advice(warn)
        self._check_op_lists(err, warn)
        for key, value in self.extra.items():
            problem = extra_problem(key, value)
            if problem is not None:
                err("extra", problem)
        return out

    def _core_issues(self, backend: Any) -> list[Issue]:
        """The core validators' issues for these choices, named by this form's fields."""
        found: list[Issue] = []
        devices = self.devices if isinstance(self.devices, int) and not isinstance(self.devices, bool) else 1
        if self.strategy == "deepspeed":
            found += deepspeed_issues(stage=self.deepspeed_stage, offload_optimizer=self.offloads,
                                      fp8_inference=self.precision in FP8_INFERENCE,
                                      precision=self.trainer_precision, backend=backend, check_installed=True)
        if self.strategy == "fsdp":
            found += fsdp_issues(backend=backend, precision="fp8" if self.precision in FP8 else None)
        found += generation_issues("fp8" if self.precision in FP8 else self.precision, backend)
        if self.precision == "fp8-quantize":
            found += fp8_quantize_issues(self.strategy, devices)
        return [replace(issue, field=VALIDATOR_FIELDS.get(issue.field, issue.field)) for issue in found]

    def _check_devices(self, backend: Any, err: Any) -> None:
        if isinstance(self.devices, bool) or not isinstance(self.devices, int) or self.devices < 1:
            err("devices", f"devices must be a whole number >= 1, got {self.devices!r}.")
            return
        available = backend.device_count()
        if self.devices > available:
            hint = backend.more_cards_hint()
            err("devices", f"{self.devices} devices asked for, but only {available} are available "
                           f"({backend.describe()}).{hint}")

    def _check_strategy(self, err: Any, warn: Any) -> None:
        devices = self.devices if isinstance(self.devices, int) else 1
        if self.strategy == "single" and devices > 1:
            err("strategy", f"the single-device strategy runs on one HPU; choose parallel / DDP for {devices} devices.")
        if self.strategy in ("parallel", "ddp", "deepspeed", "fsdp") and devices == 1:
            if self.offloads:  # the offload is real on one card: not what 'single' does
                warn("strategy", "one device: ZeRO partitions nothing across one card; what DeepSpeed gives here is "
                                 "the optimizer's state and step on the CPU (ZeRO-Offload), which 'single' does not.")
            else:
                warn("strategy", "one device: this strategy runs a single process; 'single' does the same with less "
                                 "set-up.")

    def _check_advice(self, warn: Any) -> None:
        """What a notebook user should know about these choices (none of it refuses them)."""
        devices = self.devices if isinstance(self.devices, int) else 1
        if self.offloads:
            warn("offload_optimizer", "ZeRO-Offload steps the optimizer on the CPU with DeepSpeed's own "
                                      "DeepSpeedCPUAdam (it refuses a torch optimizer): return it from your "
                                      "LightningModule's configure_optimizers (the snippet in the code). Its C++ "
                                      "op compiles on first use (about 2 minutes; cached afterwards).")
        if self.monitor and devices > 1:
            warn("monitor", "with several devices the chart shows every rank's memory as it reaches rank 0 at the "
                            "end of each logged step; the live counters are rank 0's.")
        if self.precision == "fp8-quantize":
            warn("precision", "quantize after measuring: the measurement run must have ended (its predict or "
                              "test writes them), and the model quantized is a fresh one with the same weights; "
                              f"the measurements are read from {self._fp8_dir_text}.")
        if self.relevant("autocast") and self.autocast != "plugin" and self.strategy in ("deepspeed", "fsdp"):
            warn("autocast", f"{self.strategy} manages precision itself; autocast in your own code is on top of it.")

    def _check_op_lists(self, err: Any, warn: Any) -> None:
        if not (self.lower_list or self.fp32_list):
            return
        if not self.relevant("lower_list"):
            why = ("they act through HPUPrecisionPlugin's bf16-mixed / 16-mixed autocast" if self.precision in MIXED
                   and self.strategy not in ("deepspeed", "fsdp") else
                   f"the {self.strategy} precision plugin takes none" if self.precision in MIXED else
                   "they act on bf16-mixed / 16-mixed only")
            field_name = "autocast" if self.precision in MIXED and self.autocast != "plugin" else (
                "strategy" if self.precision in MIXED else "precision")
            warn(field_name, f"the op lists are not used with these choices ({why}).")
            return
        try:
            load_op_lists(self.lower_list or None, self.fp32_list or None)
        except (ValueError, OSError) as problem:
            err("lower_list", str(problem))

    @property
    def errors(self) -> list[Issue]:
        return [i for i in self.issues() if i.is_error]

    @property
    def warnings(self) -> list[Issue]:
        return [i for i in self.issues() if not i.is_error]

    def check(self) -> None:
        """Raise InvalidConfigError listing every error (warnings do not raise)."""
        errors = self.errors
        if errors:
            raise InvalidConfigError("The Trainer configuration has errors:\n  " + "\n  ".join(map(str, errors)))

    # -- what it means ------------------------------------------------------------------------------------------
    @property
    def needs_model(self) -> bool:
        """fp8 converts the model: the code then uses your `model` (ZeRO-Offload only asks for a pasted snippet)."""
        return self.precision in FP8

    @property
    def uses_plugin(self) -> bool:
        return self.precision in FP8 or self.op_lists

    @property
    def trainer_precision(self) -> str | None:
        """The Trainer's `precision=` (None when a plugin instance carries it)."""
        if self.uses_plugin:
            return None
        if self.precision in MIXED and self.autocast != "plugin":
            return "32-true"  # autocast happens in the user's own code
        return self.precision

    def plan(self) -> Plan:
        """The statements that make the Trainer (and, for fp8, prepare `model`)."""
        steps: Plan = []
        if self.uses_plugin:
            kwargs: dict[str, Any] = {"precision": "fp8" if self.precision in FP8 else self.precision}
            if self.op_lists:
                for name in ("lower_list", "fp32_list"):
                    if getattr(self, name):
                        kwargs[name] = op_value(getattr(self, name))
            plugin = "HPUDeepSpeedPrecisionPlugin" if self.strategy == "deepspeed" else "HPUPrecisionPlugin"
            steps.append(Statement("plugin", Call(plugin, items(kwargs))))
            convert = self._convert_call()
            if convert is not None:
                comment, convert_kwargs = convert
                steps.append(Statement("model", Call("plugin.convert_modules", items(convert_kwargs),
                                                     (Ref("model"),)), note=comment, comments=(
                    "`model`: your LightningModule, made before this code (model = MyModel())",)))
        args: dict[str, Any] = {}
        args["accelerator"] = Call("HPUAccelerator") if self.accelerator == "HPUAccelerator()" else "hpu"
        args["devices"] = self.devices
        if self.strategy in STRING_STRATEGIES:
            args["strategy"] = STRING_STRATEGIES[self.strategy]
        elif self.strategy == "deepspeed":
            args["strategy"] = Call("HPUDeepSpeedStrategy", (("zero_optimization", True),
                                                             ("stage", self.deepspeed_stage),
                                                             ("offload_optimizer", self.offloads)))
        elif self.strategy == "fsdp":
            args["strategy"] = Call("HPUFSDPStrategy")
        if self.trainer_precision is not None:
            args["precision"] = self.trainer_precision
        if self.uses_plugin:
            args["plugins"] = [Ref("plugin")]
        if self.profiler:
            args["profiler"] = Call("HPUProfiler")
        if self.monitor:
            args["callbacks"] = [Call("MemoryMonitor")]
        # only what the code can write exactly (the rest is an error above; never interpolated into the code)
        args.update({k: v for k, v in self.extra.items() if extra_problem(k, v) is None})
        steps.append(Statement("trainer", Call("L.Trainer", items(args))))
        return steps

    def _convert_call(self) -> tuple[str, dict[str, Any]] | None:
        """(comment, keyword arguments) of plugin.convert_modules for fp8, else None. A blank fp8_data_path is left
        out: the measurements then live in $HABANA_LOGS, else <hpu_nb cache directory>/fp8."""
        if self.precision == "fp8":
            return "fp8 training: swaps nn.Linear layers for fp8 ones", {"replace_layers": True}
        path = {"fp8_data_path": self.fp8_data_path} if self._fp8_dir_given else {}
        if self.precision == "fp8-measure":
            return ("fp8 inference step 1: measure (trainer.predict), then quantize a fresh model",
                    {"inference": True, "quant": False, **path})
        if self.precision == "fp8-quantize":
            return ("fp8 inference step 2: quantize a fresh model with the measurements",
                    {"inference": True, "quant": True, **path})
        return None

    @property
    def _fp8_dir_given(self) -> bool:
        """A blank fp8_data_path means the default directory (the generated code leaves the argument out)."""
        return bool(str(self.fp8_data_path).strip())

    @property
    def _fp8_dir_text(self) -> str:
        if self._fp8_dir_given:
            return repr(self.fp8_data_path)
        return "$HABANA_LOGS, else hpu_nb's default <cache directory>/fp8 (no fp8 data dir given)"

    def required_names(self) -> list[str]:
        """The public names the generated code uses (each comes with its import line)."""
        return plan_names(self.plan())

    # -- building -------------------------------------------------------------------------------------------------
    def build(self, model: Any = None) -> tuple[dict[str, Any], Any]:
        """(Trainer keyword arguments, the model to use): the plan, evaluated. fp8 needs `model`."""
        self.check()
        if self.needs_model and model is None:
            raise InvalidConfigError(
                "this configuration converts your model's layers first: pass it, e.g. kwargs, model = "
                "cfg.build(model) or cfg.trainer_kwargs(model)."
            )
        return run_plan(self.plan(), model)

    def trainer_kwargs(self, model: Any = None) -> dict[str, Any]:
        """Keyword arguments for `L.Trainer(**cfg.trainer_kwargs())` (fp8: pass the model)."""
        return self.build(model)[0]

    # -- code ------------------------------------------------------------------------------------------------------
    @property
    def code(self) -> str:
        """Python that defines `trainer` as build() does; errors are listed on top as comments."""
        return plan_code(self.plan(), self.errors, (self._autocast_snippet(), self.offload_snippet()))

    def _autocast_snippet(self) -> list[str]:
        if not self.relevant("autocast") or self.autocast == "plugin":
            return []
        backend = get_backend()
        return autocast_snippet(self.precision, self.autocast, backend.autocast_device_type, backend.kind)

    def offload_snippet(self) -> list[str]:
        """ZeRO-Offload: the configure_optimizers to paste into the LightningModule (commented code lines)."""
        return offload_snippet(self.offload_lr) if self.offloads else []

    # -- convenience -------------------------------------------------------------------------------------------
    def replace(self, **changes: Any) -> TrainerConfig:
        return replace(self, **changes)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


def extra_problem(key: Any, value: Any) -> str | None:
    """Why an `extra` entry cannot be a Trainer argument in the generated code (None when it can): its key must be a
    Python identifier, and its value something the code writes as an exact literal. The message names the key (cut
    short: a hostile key is never quoted whole)."""
    problem = keyword_problem(key)
    if problem is not None:
        return (f"the key {short_repr(key)} is not a Trainer argument name: {problem}. It is left out of the code; "
                "remove it from extra.")
    if key in SETS_ITSELF:
        return f"{key!r} is set by the form; remove it from extra."
    problem = literal_problem(value)
    if problem is not None:
        return (f"extra[{key!r}]: {problem}. It is left out of the code; pass a plain value, or add the argument "
                "to the Trainer in your own code.")
    return None


def config_from(values: Iterable[tuple[str, Any]]) -> TrainerConfig:
    """A TrainerConfig from (field, value) pairs, with a clear error for an unknown field."""
    known = set(TrainerConfig.field_names())
    data = dict(values)
    unknown = sorted(set(data) - known)
    if unknown:
        raise TypeError(f"Unknown TrainerConfig field(s) {unknown}; known: {', '.join(sorted(known))}.")
    return TrainerConfig(**data)

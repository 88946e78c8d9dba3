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

from hpu_nb.core.accelerator import devices_issues
from hpu_nb.core.issues import Issue
from hpu_nb.core.oplists import load_op_lists
from hpu_nb.core.precision_rules import fp8_quantize_issues, generation_issues
from hpu_nb.core.strategies.deepspeed import OPTIMIZER_OFFLOAD_STAGES, deepspeed_issues
from hpu_nb.core.strategies.fsdp import fsdp_issues
from hpu_nb.notebook.trainer_config.choices import (
    ACCELERATOR_OPTIONS,
    AUTOCAST_OPTIONS,
    FP8_INFERENCE,
    LOG_DIRS,
    LOG_NAME,
    LOGGER_CLASSES,
    LOGGER_OPTIONS,
    MIXED,
    PRECISION_OPTIONS,
    SETS_ITSELF,
    STAGE_OPTIONS,
    STRATEGIES,
    STRATEGY_OPTIONS,
    StrategyChoice,
    default_logger,
    plugin_precision,
    tensorboard_installed,
)
from hpu_nb.notebook.trainer_config.evaluate import run_plan
from hpu_nb.notebook.trainer_config.form import control, form_fields
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

    # the form's rows, in this order (hpu_nb.notebook.trainer_config.form): a field with a control is a row
    accelerator: str = field(default="hpu", metadata=control("accelerator", "toggle", options=ACCELERATOR_OPTIONS))
    devices: int = field(default=1, metadata=control("devices", "int"))
    max_epochs: int = field(default=3, metadata=control(
        "epochs", "int", minimum=1, trainer_argument=True,
        note="a short first run (Lightning's default is 1000 epochs); raise it for more"))
    strategy: str = field(default="auto", metadata=control("strategy", "dropdown", options=STRATEGY_OPTIONS))
    deepspeed_stage: int = field(default=2, metadata=control("ZeRO stage", "toggle", options=STAGE_OPTIONS))
    offload_optimizer: bool = field(default=False, metadata=control("offload", "check",
                                                                    text="offload optimizer to CPU"))
    precision: str = field(default="32-true", metadata=control("precision", "dropdown", options=PRECISION_OPTIONS,
                                                               precision_part=True))
    autocast: str = field(default="plugin", metadata=control("autocast via", "toggle", options=AUTOCAST_OPTIONS,
                                                             precision_part=True))
    lower_list: OpList = field(default=None, metadata=control(  # ops forced to bf16 / fp16 under autocast
        "bf16 op list", "oplist", text="op names (linear, matmul) or a file", precision_part=True))
    fp32_list: OpList = field(default=None, metadata=control(  # ops kept in fp32 under autocast
        "fp32 op list", "oplist", text="op names (softmax, log_softmax) or a file", precision_part=True))
    fp8_data_path: str = field(default="fp8_data", metadata=control("fp8 data dir", "text", precision_part=True))
    profiler: bool = field(default=False, metadata=control("profiler", "check", text="HPUProfiler()"))
    monitor: bool = field(default=False, metadata=control("memory chart", "check", text="MemoryMonitor()"))
    logger: str = field(default_factory=default_logger, metadata=control("logger", "dropdown", options=LOGGER_OPTIONS))
    checkpointing: bool = field(default=False, metadata=control("checkpoints", "check",
                                                                text="save checkpoints (ModelCheckpoint)"))
    # not in the form
    offload_lr: float = 1e-3  # learning rate of DeepSpeedCPUAdam, the optimizer ZeRO-Offload needs
    extra: dict[str, Any] = field(default_factory=dict)  # more Trainer arguments, e.g. {"gradient_clip_val": 1.0}

    # -- which fields matter ----------------------------------------------------------------------------------
    def relevant(self, name: str) -> bool:
        """Does `name` matter for the current choices? A field that does not is ignored (and its control disabled)."""
        if name == "deepspeed_stage":
            return self.strategy == "deepspeed"
        if name in ("offload_optimizer", "offload_lr"):
            return self.strategy == "deepspeed" and self.deepspeed_stage in OPTIMIZER_OFFLOAD_STAGES and (
                name == "offload_optimizer" or self.offload_optimizer)
        if name == "autocast":
            return self.precision in MIXED
        if name in ("lower_list", "fp32_list"):
            return self.precision in MIXED and self.autocast == "plugin" and self._strategy.takes_op_lists
        if name == "fp8_data_path":
            return self.precision in FP8_INFERENCE
        return True

    @property
    def _strategy(self) -> StrategyChoice:
        return STRATEGIES.get(self.strategy, STRATEGIES["auto"])

    @property
    def _default_plugin(self) -> type:
        return STRATEGIES["auto"].precision_plugin

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

        self._check_form_values(err)
        if out:
            return out
        backend = get_backend()
        out += devices_issues(self.devices, backend)
        self._check_strategy(err, warn)
        out += self._core_issues(backend)
        self._check_advice(warn)
        self._check_op_lists(err, warn)
        if self.logger == "tensorboard" and "logger" not in self.extra and not tensorboard_installed():
            err("logger", "TensorBoard is not installed in this kernel: `pip install tensorboard` (`make lab` installs "
                          "it), or choose CSV or none.")
        for key, value in self.extra.items():
            problem = extra_problem(key, value)
            if problem is not None:
                err("extra", problem)
        return out

    def _check_form_values(self, err: Any) -> None:
        """Each field with choices holds one of them; an "int" field is a whole number within its bound."""
        for name, spec in form_fields(type(self)).items():
            value = getattr(self, name)
            if spec.options and self.relevant(name) and value not in spec.values:
                err(name, f"{value!r} is not one of: {', '.join(map(repr, spec.values))}.")
            elif spec.minimum is not None and (isinstance(value, bool) or not isinstance(value, int)
                                               or value < spec.minimum):
                err(name, f"{name} must be a whole number >= {spec.minimum}, got {value!r}.")

    def _core_issues(self, backend: Any) -> list[Issue]:
        """The core validators' issues for these choices, named by this form's fields."""
        found: list[Issue] = []
        devices = self.devices if isinstance(self.devices, int) and not isinstance(self.devices, bool) else 1
        if self.strategy == "deepspeed":
            found += deepspeed_issues(stage=self.deepspeed_stage, offload_optimizer=self.offloads,
                                      fp8_inference=self.precision in FP8_INFERENCE,
                                      precision=self.trainer_precision, backend=backend, check_installed=True)
        if self.strategy == "fsdp":
            found += fsdp_issues(backend=backend, precision="fp8" if self.needs_model else None)
        found += generation_issues(plugin_precision(self.precision), backend)
        if self.precision == "fp8-quantize":
            found += fp8_quantize_issues(self.strategy, devices)
        return [replace(issue, field=VALIDATOR_FIELDS.get(issue.field, issue.field)) for issue in found]

    def _check_strategy(self, err: Any, warn: Any) -> None:
        devices = self.devices if isinstance(self.devices, int) else 1
        if self._strategy.one_device and devices > 1:
            err("strategy", f"the single-device strategy runs on one HPU; choose parallel / DDP for {devices} devices.")
        if self._strategy.parallel and devices == 1:
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
        plugin = self._strategy.precision_plugin
        if self.relevant("autocast") and self.autocast != "plugin" and plugin is not self._default_plugin:
            warn("autocast", f"{self._strategy.words} runs in 32-true here ({plugin.__name__}(\"32-true\"): fp32 "
                             f"weights and optimizer); your autocast computes in {self.precision} inside your "
                             f"forward only. For {self._strategy.words}'s own {self.precision}, choose 'precision "
                             "plugin'.")

    def _check_op_lists(self, err: Any, warn: Any) -> None:
        if not (self.lower_list or self.fp32_list):
            return
        if not self.relevant("lower_list"):
            plugin = self._strategy.precision_plugin
            if self.precision not in MIXED:
                field_name, why = "precision", f"they act on {' / '.join(MIXED)} only"
            elif not self._strategy.takes_op_lists:
                field_name, why = "strategy", f"{self._strategy.words}'s plugin, {plugin.__name__}, takes none"
            else:
                field_name, why = "autocast", f"they act through {plugin.__name__}'s autocast"
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
        return plugin_precision(self.precision) == "fp8"

    @property
    def uses_plugin(self) -> bool:
        return self.needs_model or self.op_lists

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
            kwargs: dict[str, Any] = {"precision": plugin_precision(self.precision)}
            if self.op_lists:
                for name in ("lower_list", "fp32_list"):
                    if getattr(self, name):
                        kwargs[name] = op_value(getattr(self, name))
            plugin = self._strategy.precision_plugin.__name__  # the plugin core gives this strategy
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
        if self._strategy.cls is not None:  # "auto": Lightning's choice, no argument
            name = self._strategy.code_name
            args["strategy"] = name if self._strategy.by_name else Call(name, items(self._strategy_arguments()))
        if self.trainer_precision is not None:
            args["precision"] = self.trainer_precision
        if self.uses_plugin:
            args["plugins"] = [Ref("plugin")]
        if self.profiler:
            args["profiler"] = Call("HPUProfiler")
        if self.monitor:
            args["callbacks"] = [Call("MemoryMonitor")]
        notes = []
        if "logger" not in self.extra:  # `extra` may set it instead
            args["logger"] = (Call(LOGGER_CLASSES[self.logger], items({"save_dir": LOG_DIRS[self.logger],
                                                                       "name": LOG_NAME}))
                              if self.logger in LOGGER_CLASSES else False)
            if self.logger == "tensorboard":
                notes.append(("logger", f"to see it: %load_ext tensorboard, then %tensorboard --logdir "
                                        f"{LOG_DIRS['tensorboard']}"))
        if "enable_checkpointing" not in self.extra:
            args["enable_checkpointing"] = self.checkpointing
            if not self.checkpointing:
                notes.append(("enable_checkpointing", "no checkpoint files (tick 'checkpoints' in the form for them)"))
        for name, spec in form_fields(type(self)).items():
            if spec.trainer_argument and name not in self.extra:  # `extra` may set it instead
                args[name] = getattr(self, name)
                notes += [(name, spec.note)] if spec.note else []
        # only what the code can write exactly (the rest is an error above; never interpolated into the code)
        args.update({k: v for k, v in self.extra.items() if extra_problem(k, v) is None})
        steps.append(Statement("trainer", Call("L.Trainer", items(args)), arg_notes=tuple(notes)))
        return steps

    def _strategy_arguments(self) -> dict[str, Any]:
        """The strategy's constructor arguments the form sets (DeepSpeed's ZeRO stage and offload)."""
        if self.strategy != "deepspeed":
            return {}
        return {"zero_optimization": True, "stage": self.deepspeed_stage, "offload_optimizer": self.offloads}

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


def config_from(values: Iterable[tuple[str, Any]], cls: type[TrainerConfig] | None = None) -> TrainerConfig:
    """A TrainerConfig (or a subclass with more fields) from (field, value) pairs; a clear error for an unknown one."""
    cls = cls or TrainerConfig
    known = set(cls.field_names())
    data = dict(values)
    unknown = sorted(set(data) - known)
    if unknown:
        raise TypeError(f"Unknown TrainerConfig field(s) {unknown}; known: {', '.join(sorted(known))}.")
    return cls(**data)

"""The Trainer form's vocabulary: the values each field accepts and the words the form shows for them.

The values and the rules about them are hpu_nb.core's (the precisions its plugins run, the ZeRO stages, which precision
plugin a strategy gets, what each precision needs of the Gaudi generation); this module only adds the form's own
choices (the two steps of fp8 inference, the autocast style) and the words, so a new rule in core reaches the form
without an edit here.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from lightning.pytorch.strategies import ParallelStrategy, SingleDeviceStrategy

from hpu_nb.core.precision_names import AUTOCAST_PRECISIONS, PLUGIN_PRECISIONS
from hpu_nb.core.precision_rules import generation_feature
from hpu_nb.core.selection import precision_plugin_class, takes_op_lists
from hpu_nb.core.strategies.deepspeed import ZERO_STAGES, HPUDeepSpeedStrategy
from hpu_nb.core.strategies.fsdp import HPUFSDPStrategy
from hpu_nb.core.strategies.parallel import HPUDDPStrategy, HPUParallelStrategy
from hpu_nb.core.strategies.single import SingleHPUStrategy
from hpu_nb.runtime.generations import first_supporting

AUTOCAST_STYLES = ("plugin", "context", "decorator")
AUTOCAST_LABELS = {"plugin": "precision plugin", "context": "with torch.autocast", "decorator": "@torch.autocast"}


@dataclass(frozen=True)
class StrategyChoice:
    """One choice of the strategy field: the hpu_nb strategy it means (None: "auto", Lightning's choice)."""

    words: str
    cls: type | None = None
    by_name: bool = True  # the code writes strategy="<its registered name>", else a constructor call

    @property
    def code_name(self) -> str:
        """What the code writes: the registered name ("hpu_single"), or the class to call ("HPUFSDPStrategy")."""
        assert self.cls is not None
        return str(getattr(self.cls, "strategy_name", "")) if self.by_name else self.cls.__name__

    @property
    def label(self) -> str:
        return self.words if self.cls is None else f"{self.words} ({self.code_name})"

    @property
    def precision_plugin(self) -> type:
        """The precision plugin class this strategy gets (core's choice, as Trainer(precision=...) makes it)."""
        return precision_plugin_class(self.cls)

    @property
    def takes_op_lists(self) -> bool:
        return takes_op_lists(self.precision_plugin)

    @property
    def one_device(self) -> bool:
        """A single-device strategy (Lightning's SingleDeviceStrategy): one HPU only."""
        return self.cls is not None and issubclass(self.cls, SingleDeviceStrategy)

    @property
    def parallel(self) -> bool:
        """A strategy of several processes (Lightning's ParallelStrategy), even when asked for one device."""
        return self.cls is not None and issubclass(self.cls, ParallelStrategy)


STRATEGIES = {
    "auto": StrategyChoice("auto (single for 1 device, parallel for more)"),
    "single": StrategyChoice("single device", SingleHPUStrategy),
    "parallel": StrategyChoice("parallel / DDP over HCCL", HPUParallelStrategy),
    "ddp": StrategyChoice("DDP", HPUDDPStrategy),
    "deepspeed": StrategyChoice("DeepSpeed ZeRO", HPUDeepSpeedStrategy, by_name=False),
    "fsdp": StrategyChoice("FSDP", HPUFSDPStrategy, by_name=False),
}

# the precisions: what hpu_nb's plugins run, plus fp8 inference's two steps (convert_modules(inference=True))
FP8_INFERENCE = ("fp8-measure", "fp8-quantize")
PRECISIONS = (*PLUGIN_PRECISIONS, *FP8_INFERENCE)
MIXED = AUTOCAST_PRECISIONS  # the precisions whose autocast the style and op lists are about
_PRECISION_WORDS = {"32-true": "32-true (fp32)", "16-mixed": "16-mixed (fp16)", "fp8": "fp8 training",
                    "fp8-measure": "fp8 inference: 1. measure", "fp8-quantize": "fp8 inference: 2. quantize"}


def plugin_precision(precision: str) -> str:
    """The plugin's precision for a form choice: "fp8" for fp8 inference's steps, else the choice itself."""
    return "fp8" if precision in FP8_INFERENCE else precision


def precision_label(precision: str) -> str:
    """The words for a precision, with the first Gaudi generation that runs it ("16-mixed (fp16, Gaudi2+)")."""
    words = _PRECISION_WORDS.get(precision, precision)
    feature = generation_feature(plugin_precision(precision))
    if feature is None:
        return words
    since = f"{first_supporting(feature).label}+"
    return f"{words[:-1]}, {since})" if words.endswith(")") else f"{words} ({since})"


# the logger of the generated code: never Lightning's default (a lightning_logs/version_N folder per run, and without
# TensorBoard its "tensorboardX has been removed" warning). TensorBoard is what Gaudi's tutorials open.
LOG_DIRS = {"tensorboard": "tb_logs", "csv": "csv_logs"}
LOG_NAME = "hpu_nb"  # the experiment folder under the log directory (Lightning's default name is "lightning_logs")
LOGGER_CLASSES = {"tensorboard": "TensorBoardLogger", "csv": "CSVLogger"}
LOGGER_OPTIONS = (("TensorBoard (tb_logs/)", "tensorboard"), ("CSV (csv_logs/)", "csv"), ("none", "none"))


def tensorboard_installed() -> bool:
    """Whether Lightning's TensorBoardLogger can write here (it takes `tensorboard`, else `tensorboardX`)."""
    return any(importlib.util.find_spec(name) is not None for name in ("tensorboard", "tensorboardX"))


def default_logger() -> str:
    """The form's default logger: TensorBoard where it is installed, else none (nothing written, nothing printed)."""
    return "tensorboard" if tensorboard_installed() else "none"


# (label, value) of each choice, in the form's order
ACCELERATOR_OPTIONS = (('"hpu"', "hpu"), ("HPUAccelerator()", "HPUAccelerator()"))
STRATEGY_OPTIONS = tuple((choice.label, key) for key, choice in STRATEGIES.items())
STAGE_OPTIONS = tuple((f"ZeRO-{stage}", stage) for stage in ZERO_STAGES)
PRECISION_OPTIONS = tuple((precision_label(p), p) for p in PRECISIONS)
AUTOCAST_OPTIONS = tuple((AUTOCAST_LABELS[s], s) for s in AUTOCAST_STYLES)
SETS_ITSELF = ("accelerator", "devices", "strategy", "precision", "plugins", "profiler", "callbacks")  # not in extra

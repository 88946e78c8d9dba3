"""fp8 on the HPU, below the Lightning layer: one interface (`Fp8Engine`), two engines.

- Training, on both: the transformer engine (`te.Linear`, `te.fp8_autocast`; hpu_nb.runtime.fp8.transformer_engine),
  Habana's on a Gaudi, the emulated one (real fp8 numerics on the CPU) on the emulated Gaudi.
- Inference on a Gaudi: Intel Neural Compressor (hpu_nb.runtime.habana_fp8.HabanaFp8Engine); on the emulated Gaudi:
  max-abs measurement / static quantization that write and read INC's file format
  (hpu_nb.emulator.fp8.engine.EmulatedFp8Engine).
`DeviceBackend.fp8_engine()` gives the one in force; hpu_nb.core.fp8 (configs, files, Lightning) calls only this.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from hpu_nb.runtime.fp8.recipe import AMAX_ALGOS, DelayedScaling, Format, as_recipe

__all__ = ["AMAX_ALGOS", "DelayedScaling", "Format", "Fp8Engine", "Fp8EngineError", "as_recipe"]


class Fp8EngineError(RuntimeError):
    """The fp8 engine in force cannot do what was asked (an unsupported setting, a model that does not match)."""


class Fp8Engine(ABC):
    """What fp8 training and inference need from the device's software."""

    name: str  # shown in messages: "Habana transformer engine + Intel Neural Compressor" / "emulated fp8"

    # -- training ------------------------------------------------------------------------------------------------------
    @abstractmethod
    def is_fp8_layer(self, module: Any) -> bool:
        """Whether `module` already is an fp8 training layer of this engine."""

    @abstractmethod
    def fp8_layer(self, linear: Any, recipe: Any) -> Any:
        """An fp8 training layer holding `linear`'s weight and bias (not re-initialised); `recipe` as for autocast."""

    @abstractmethod
    def autocast(self, enabled: bool, recipe: Any) -> AbstractContextManager[None]:
        """fp8 for this engine's layers inside the block; `recipe` is hpu_nb's DelayedScaling, a dict, None, or the
        engine's own recipe object."""

    # -- inference: measure, then quantize in another process ----------------------------------------------------------
    @abstractmethod
    def check_inference_config(self, config: Mapping[str, Any]) -> None:
        """Refuse, naming the setting, what this engine cannot do with a well-formed config."""

    @abstractmethod
    def start_measurement(self, model: Any, config: Mapping[str, Any]) -> Any:
        """Set `model` up to record statistics while it predicts; returns the model to run."""

    @abstractmethod
    def finish_measurement(self, model: Any, config: Mapping[str, Any], path: Path) -> Path:
        """Write what `model` recorded (this engine names the file itself when it writes on its own); returns it."""

    @abstractmethod
    def quantize(self, model: Any, config: Mapping[str, Any], measurements: Mapping[str, Any] | None) -> Any:
        """Run `model`'s measured layers in fp8 from `measurements` (a measurement document; None when the engine
        reads the files itself); returns the model to run."""

    def inference_support(self) -> tuple[bool, str]:
        """(available, reason): whether fp8 inference (measure, then quantize) can run with this engine."""
        return True, ""

    @property
    def reads_measurements_itself(self) -> bool:
        """Whether quantize() finds the measurement files on its own (INC does) rather than being handed them."""
        return False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

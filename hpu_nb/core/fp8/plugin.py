"""fp8 for a precision plugin: `HPUFp8Mixin`, shared by HPUPrecision (Fabric), HPUPrecisionPlugin (Trainer) and the
DeepSpeed plugin.

Lightning's strategies and Fabric's `setup` call the plugin's `convert_module` while they set the model up (as they
do for Lightning's TransformerEnginePrecision): with precision="fp8" and replace_layers=True the nn.Linear layers are
swapped for fp8 layers there, before the optimizers are made. `convert_modules` stays for lightning-habana's explicit
call (training layers, or fp8 inference: measure / quantize).
"""

from __future__ import annotations

import os
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from lightning.fabric.utilities.rank_zero import rank_zero_warn
from typing_extensions import override

from hpu_nb.core.fp8.convert import convert_modules, has_fp8_layers
from hpu_nb.core.fp8.inference import (
    QUANT_CONFIG_ENV,
    Fp8InferenceError,
    finalize_measurements,
    pending_measurements,
    read_config,
    state_of,
)
from hpu_nb.runtime import get_backend

if TYPE_CHECKING:
    from lightning.fabric.plugins.precision import Precision as PrecisionHost
else:
    PrecisionHost = object  # a base for the type checker only (as strategies/hosts.py): the plugin's Lightning base

__all__ = ["Fp8PrecisionRequired", "HPUFp8Mixin", "finish_run_measurements", "measuring_modules"]


class Fp8PrecisionRequired(ValueError, AssertionError):
    """convert_modules() on a plugin whose precision is not "fp8": a bad argument (ValueError); an AssertionError too,
    the type lightning-habana raised (its `assert`), so its users' `pytest.raises(AssertionError)` still holds."""


class HPUFp8Mixin(PrecisionHost):
    """fp8 for a precision plugin: `convert_module` (Lightning's set-up hook), `convert_modules` (fp8 training layers,
    or fp8 inference: measure / quantize), the models it set up to measure, and `finish_measurements`, which the HPU
    strategies call at the end of trainer.predict / trainer.test. Put it before the Lightning base
    (`class P(HPUFp8Mixin, Precision)`) and call `_init_fp8` once `self.precision` is set.
    """

    # Lightning declares `precision` as its own names (a Literal) and has no "fp8": the HPU plugins hold a str.
    precision: str  # type: ignore[assignment]

    def _init_fp8(self, recipe: Any, replace_layers: bool) -> None:
        if (recipe is not None or replace_layers) and self.precision != "fp8":
            rank_zero_warn(f"precision={self.precision!r} is not 'fp8': recipe and replace_layers are ignored.")
        self.recipe = recipe if self.precision == "fp8" else None
        self.replace_layers = bool(replace_layers) and self.precision == "fp8"
        # models in fp8 measurement mode, written at the end of predict / test
        self._measuring: list[weakref.ref[torch.nn.Module]] = []
        # lightning-habana's flags: what this plugin can do with fp8 here (both False for other precisions)
        fp8 = self.precision == "fp8"
        self.fp8_training_available = fp8  # validate_precision refused fp8 where it cannot train
        self.fp8_inference_available = fp8 and get_backend().fp8_engine().inference_support()[0]

    @override
    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Lightning's set-up hook: with precision="fp8" and replace_layers=True, swap nn.Linear for fp8 layers (a
        model that already holds fp8 layers is left as it is, as Lightning's TransformerEnginePrecision does)."""
        module = super().convert_module(module)
        if self.precision == "fp8" and self.replace_layers and not has_fp8_layers(module):
            return convert_modules(module, replace_layers=True, recipe=self.recipe)
        return module

    def convert_modules(
        self,
        module: torch.nn.Module,
        inference: bool = False,
        quant: bool | str | dict[str, Any] = True,
        fp8_data_path: str | None = None,
        *,
        replace_layers: bool | None = None,
        recipe: Any = None,
    ) -> torch.nn.Module:
        """Prepare `module` for fp8: training layers (replace_layers=True), or inference: quant=False measures,
        quant=True quantizes (a config file path or dict, as lightning-habana took, decides by its "mode").
        Measurements live in `fp8_data_path`, else $HABANA_LOGS, else `<hpu_nb cache directory>/fp8`
        ($HPU_NB_CACHE_DIR, else ~/.cache/hpu_nb): measure and quantize find them there without a path.

        Returns the model to train / predict with (the same object on the emulated Gaudi).
        """
        if self.precision != "fp8":
            raise Fp8PrecisionRequired(
                f"{type(self).__name__}.convert_modules() should only be used with precision=`fp8`. This plugin's"
                f" precision is {self.precision!r}: make it {type(self).__name__}(precision='fp8')."
            )
        if recipe is not None:
            self.recipe = recipe
        if replace_layers is not None:
            self.replace_layers = bool(replace_layers)
        if inference:
            return self._convert_for_inference(module, quant, fp8_data_path)
        if not self.replace_layers:
            rank_zero_warn("convert_modules(): nothing to do; pass replace_layers=True (training) or inference=True.")
            return module
        return convert_modules(module, replace_layers=True, recipe=self.recipe)

    def _convert_for_inference(
        self, module: torch.nn.Module, quant: bool | str | dict[str, Any], fp8_data_path: str | None
    ) -> torch.nn.Module:
        """Set `module` up for the inference step now (the DeepSpeed plugin waits until DeepSpeed has wrapped it)."""
        return self._track(convert_modules(module, inference=True, quant=quant, fp8_data_path=fp8_data_path))

    def _track(self, converted: torch.nn.Module) -> torch.nn.Module:
        """Remember a model set up to measure: finish_measurements writes its measurements."""
        state = state_of(converted)
        if state is not None and state.mode == "measure":
            self._measuring.append(weakref.ref(converted))
        return converted

    def finish_measurements(self, model: torch.nn.Module | None = None) -> list[Path]:
        """Write the fp8 measurements of the models this plugin set up and, with precision="fp8", of any module of
        `model` (the run's) set up to measure by another plugin: lightning-habana's strategies call Intel Neural
        Compressor's finalize_calibration(model) whenever the Trainer's precision is fp8. The HPU strategies call it at
        the end of trainer.predict / trainer.test, while the model is still on the device."""
        models = [ref() for ref in self._measuring]
        if model is not None and self.precision == "fp8":
            models += measuring_modules(model)
        written: list[Path] = []
        for each in models:
            if each is not None:
                written += finalize_measurements(each)
        return written

    @override
    def teardown(self) -> None:
        pending = [ref() for ref in self._measuring]
        if any(model is not None and model in pending_measurements() for model in pending):
            rank_zero_warn(
                "fp8 measurements were not written: they are written at the end of trainer.predict() or trainer.test(),"
                " while the model is on the device. Run one of them with this plugin (fit() does not measure).")
        super().teardown()


def measuring_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """`model` or its submodules set up to measure whose measurements are not written yet."""
    pending = pending_measurements()
    return [module for module in model.modules() if any(module is p for p in pending)]


def finish_run_measurements(precision_plugin: Any, model: torch.nn.Module | None, stage: str) -> list[Path]:
    """End of trainer.predict / trainer.test, the model still on the device: the precision plugin writes the fp8
    measurements. What would waste the measure step in silence is said here, not found out by the quantize process:
    a module of the run left measuring (the Trainer was not given an fp8 plugin) is an error naming the plugin to add;
    QUANT_CONFIG asking to measure while nothing in the run was set up to measure is a warning naming the call (it
    may be set for a later step, so the run itself is not refused).

    As Intel Neural Compressor: its measurements are written only by finalize_calibration(model) (lightning-habana's
    strategies call it when the Trainer's precision is fp8), and QUANT_CONFIG is read only by its prepare()."""
    finish = getattr(precision_plugin, "finish_measurements", None)
    written: list[Path] = finish(model) if callable(finish) else []
    if model is None:
        return written
    left = measuring_modules(model)
    if left:
        names = ", ".join(sorted({type(module).__name__ for module in left}))
        precision = getattr(precision_plugin, "precision", None)
        raise Fp8InferenceError(
            f"fp8 measurements of {names} were not written: it was set up to measure (convert_modules(...,"
            f" inference=True, quant=False)), but this Trainer's precision plugin is {type(precision_plugin).__name__}"
            f"(precision={precision!r}), which does not write fp8 measurements. Give the Trainer the plugin that"
            " converted it: Trainer(accelerator=\"hpu\", plugins=[plugin]) with plugin = HPUPrecisionPlugin(\"fp8\")"
            f" (HPUDeepSpeedPrecisionPlugin(\"fp8\") under DeepSpeed), then run trainer.{stage}() again.")
    if not written and not _set_up_for_fp8_inference(model):
        _warn_if_quant_config_measures(stage)
    return written


def _set_up_for_fp8_inference(model: torch.nn.Module) -> bool:
    return any(state_of(module) is not None for module in model.modules())


def _warn_if_quant_config_measures(stage: str) -> None:
    user = os.environ.get(QUANT_CONFIG_ENV)
    if not user:
        return
    try:
        mode = read_config(Path(user), f"{QUANT_CONFIG_ENV} file", made_by_measuring=False)["mode"]
    except (OSError, Fp8InferenceError):
        return  # the step that reads it (convert_modules) names what is wrong with it
    if mode == "MEASURE":
        rank_zero_warn(
            f"{QUANT_CONFIG_ENV}={user} asks for an fp8 measurement (mode 'MEASURE'), but trainer.{stage}() measured"
            " nothing: no module of the model was set up to measure, and QUANT_CONFIG alone does not (as with Intel"
            " Neural Compressor, only its prepare() reads it). No measurement was written. Convert the model first:"
            " plugin = HPUPrecisionPlugin(\"fp8\"); model = plugin.convert_modules(model, inference=True, quant=False);"
            f" then Trainer(accelerator=\"hpu\", plugins=[plugin]).{stage}(model, ...).")

"""HPUPrecisionPlugin: mixed precision on Gaudi, real or emulated: autocast on "hpu" with Habana's op lists.

Precisions: "32-true" ("32"), "bf16-mixed" ("bf16"), "16-mixed" and "fp8" (the last two from Gaudi2 on).
Operator lists are Habana's: files named by the variables the installed release reads, applied by the device's
autocast (hpu_nb.core.oplists; the plugin's lower_list= / fp32_list= set them). fp8 training and fp8 inference
(measure, then quantize) live in hpu_nb.core.fp8.

This module is the one home of the precision names (`PRECISION_ALIASES`); the DeepSpeed and FSDP plugins read it.
Reusable pieces for other precision plugins: `unify_precision`, `validate_precision`, `autocast_context`,
`hpu_autocast`, `autocast_device_type`, and `HPUFp8Mixin` (convert_modules / finish_measurements, over
hpu_nb.core.fp8).
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Generator, Mapping
from typing import Any

import torch
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from typing_extensions import override

from hpu_nb.core.oplists import OpListSource, apply_op_lists, load_op_lists, shadowed_fp32_ops
from hpu_nb.runtime import get_backend

__all__ = [
    "HPUFp8Mixin",
    "HPUPrecisionPlugin",
    "PRECISION_CHOICES",
    "UnsupportedPrecisionError",
    "autocast_context",
    "autocast_device_type",
    "autocast_dtype",
    "hpu_autocast",
    "unify_precision",
    "validate_precision",
]

# What users may write -> Lightning's unified name: the one table for every HPU precision plugin. "16" is Lightning's
# shorthand for "16-mixed", with a warning (HMP meant bfloat16 by it): see validate_precision.
PRECISION_ALIASES = {
    "32-true": "32-true",
    "32": "32-true",
    "bf16-mixed": "bf16-mixed",
    "bf16": "bf16-mixed",
    "16-mixed": "16-mixed",
    "16": "16-mixed",
    "fp8": "fp8",
    "bf16-true": "bf16-true",
    "16-true": "16-true",
}
PLUGIN_PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "fp8")  # what HPUPrecisionPlugin runs
PRECISION_CHOICES = tuple(
    alias for alias, name in PRECISION_ALIASES.items() if name in PLUGIN_PRECISIONS and alias != "16"
)
_HMP_KEYS = ("level", "verbose", "bf16_ops", "fp32_ops")


def unify_precision(precision: Any) -> str | None:
    """Lightning's unified name for what a user wrote ("bf16" -> "bf16-mixed", 32 -> "32-true"), or None."""
    if isinstance(precision, bool) or not isinstance(precision, (str, int)):
        return None
    return PRECISION_ALIASES.get(str(precision).strip())


class UnsupportedPrecisionError(ValueError):
    """This precision cannot run on this Gaudi generation (fp16 / fp8 on first-generation Gaudi)."""


def validate_precision(precision: Any, *, check_device: bool = True) -> str:
    """Lightning's unified precision name for `precision`, or a ValueError listing the choices.

    With `check_device`, "16-mixed" and "fp8" raise UnsupportedPrecisionError on a first-generation Gaudi.
    """
    text = str(precision).strip() if isinstance(precision, (str, int)) and not isinstance(precision, bool) else None
    if text == "16":  # what Trainer(precision=16) means too: Lightning's historical shorthand for "16-mixed"
        rank_zero_warn(
            f"precision={precision!r} means '16-mixed' (float16), as in Lightning; Habana's HMP meant bfloat16 by 16:"
            " for that, use 'bf16-mixed'."
        )
    unified = unify_precision(precision)
    if unified not in PLUGIN_PRECISIONS:
        raise ValueError(
            f"HPUPrecisionPlugin(precision={precision!r}) is not supported. Choose one of: "
            f"{', '.join(PRECISION_CHOICES)}."
        )
    if check_device:
        backend = get_backend()
        check = {"16-mixed": backend.fp16_support, "fp8": backend.fp8_support}.get(unified)
        if check is not None:
            ok, reason = check()
            if not ok:
                hint = " Use precision='bf16-mixed' instead." if unified == "16-mixed" else ""
                raise UnsupportedPrecisionError(f"precision={precision!r} cannot run here: {reason}{hint}")
    return unified


def autocast_device_type() -> str:
    """The `device_type` for torch.autocast: "hpu", on a Gaudi and on the emulated Gaudi alike."""
    return get_backend().autocast_device_type


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of a unified precision name (None for full precision). fp8 runs the rest in bf16."""
    return {"bf16-mixed": torch.bfloat16, "fp8": torch.bfloat16, "16-mixed": torch.float16}.get(precision)


@contextlib.contextmanager
def hpu_autocast(
    dtype: torch.dtype = torch.bfloat16,
    enabled: bool = True,
    *,
    cache_enabled: bool | None = None,
) -> Generator[None, None, None]:
    """torch.autocast on the device type of the HPU ("hpu", on a Gaudi and on the emulated Gaudi alike).

    Works as a context manager and as a decorator. The op lists in force are the device's (hpu_nb.core.oplists).
    """
    with torch.autocast(autocast_device_type(), dtype=dtype, enabled=enabled, cache_enabled=cache_enabled):
        yield


@contextlib.contextmanager
def autocast_context(precision: str, *, recipe: Any = None) -> Generator[None, None, None]:
    """The forward context for a unified precision: autocast on "hpu" (+ fp8 for "fp8"); cached casts are off on HPU."""
    dtype = autocast_dtype(precision)
    with contextlib.ExitStack() as stack:
        if dtype is not None:
            stack.enter_context(torch.autocast(autocast_device_type(), dtype=dtype, cache_enabled=False))
        if precision == "fp8":
            from hpu_nb.core.fp8 import fp8_autocast

            stack.enter_context(fp8_autocast(enabled=True, recipe=recipe))
        yield


class HPUFp8Mixin:
    """fp8 for a precision plugin: `convert_modules` (fp8 training layers, or fp8 inference: measure / quantize), the
    models it set up to measure, and `finish_measurements`, which the HPU strategies call at the end of
    trainer.predict / trainer.test. One implementation for HPUPrecisionPlugin and HPUDeepSpeedPrecisionPlugin: put it
    before the Lightning base (`class P(HPUFp8Mixin, Precision)`) and call `_init_fp8` once `self.precision` is set.
    """

    precision: str

    def _init_fp8(self, recipe: Any, replace_layers: bool) -> None:
        if (recipe is not None or replace_layers) and self.precision != "fp8":
            rank_zero_warn(f"precision={self.precision!r} is not 'fp8': recipe and replace_layers are ignored.")
        self.recipe = recipe if self.precision == "fp8" else None
        self.replace_layers = bool(replace_layers) and self.precision == "fp8"
        self._measuring: list[weakref.ref] = []  # models in fp8 measurement mode, written at the end of predict / test
        # lightning-habana's flags: what this plugin can do with fp8 here (both False for other precisions)
        fp8 = self.precision == "fp8"
        self.fp8_training_available = fp8  # validate_precision refused fp8 where it cannot train
        self.fp8_inference_available = fp8 and get_backend().fp8_engine().inference_support()[0]

    def convert_modules(
        self,
        module: torch.nn.Module,
        inference: bool = False,
        quant: bool | str | dict = True,
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
            raise ValueError(
                f"convert_modules() needs {type(self).__name__}(precision='fp8'), not {self.precision!r}."
            )
        from hpu_nb.core import fp8

        if recipe is not None:
            self.recipe = recipe
        if replace_layers is not None:
            self.replace_layers = bool(replace_layers)
        if inference:
            return self._convert_for_inference(module, quant, fp8_data_path)
        if not self.replace_layers:
            rank_zero_warn("convert_modules(): nothing to do; pass replace_layers=True (training) or inference=True.")
            return module
        return fp8.convert_modules(module, replace_layers=True, recipe=self.recipe)

    def _convert_for_inference(
        self, module: torch.nn.Module, quant: bool | str | dict, fp8_data_path: str | None
    ) -> torch.nn.Module:
        """Set `module` up for the inference step now (the DeepSpeed plugin waits until DeepSpeed has wrapped it)."""
        from hpu_nb.core import fp8

        return self._track(fp8.convert_modules(module, inference=True, quant=quant, fp8_data_path=fp8_data_path))

    def _track(self, converted: torch.nn.Module) -> torch.nn.Module:
        """Remember a model set up to measure: finish_measurements writes its measurements."""
        from hpu_nb.core import fp8

        state = fp8.state_of(converted)
        if state is not None and state.mode == "measure":
            self._measuring.append(weakref.ref(converted))
        return converted

    def finish_measurements(self) -> list:
        """Write the fp8 measurements of the models this plugin set up. The HPU strategies call it at the end of
        trainer.predict / trainer.test, while the model is still on the device (as lightning-habana did)."""
        from hpu_nb.core.fp8 import finalize_measurements

        written = []
        for ref in self._measuring:
            model = ref()
            if model is not None:
                written += finalize_measurements(model)
        return written

    @override
    def teardown(self) -> None:
        from hpu_nb.core.fp8 import pending_measurements

        pending = [ref() for ref in self._measuring]
        if any(model is not None and model in pending_measurements() for model in pending):
            rank_zero_warn(
                "fp8 measurements were not written: they are written at the end of trainer.predict() or trainer.test(),"
                " while the model is on the device. Run one of them with this plugin (fit() does not measure).")
        super().teardown()  # type: ignore[misc]


class HPUPrecisionPlugin(HPUFp8Mixin, Precision):
    """Mixed precision for HPU: bf16 / fp16 autocast with Habana-style op lists, and fp8 training / inference.

    Args:
        precision: "32-true" / "32", "bf16-mixed" / "bf16", "16-mixed" (Gaudi2+), "fp8" (Gaudi2+).
        device: kept for lightning-habana compatibility; autocast always uses the backend's device type.
        recipe: fp8 recipe (hpu_nb.core.fp8.DelayedScaling, Habana's te.recipe.DelayedScaling, or a dict).
        replace_layers: with precision="fp8", convert_modules() swaps nn.Linear for fp8 layers.
        lower_list / fp32_list: op-list file path or op names, replacing Habana's default list (the device reads the
            variables PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST / PT_HPU_AUTOCAST_FP32_OPS_LIST; on a Gaudi, set them
            before Python starts instead: Habana reads them when it loads).
        bf16_file_path / fp32_file_path / opt_level / verbose / hmp_params: seed (HMP) arguments, still read.
    """

    def __init__(
        self,
        precision: str | int = "32-true",
        device: str = "hpu",
        recipe: Any = None,
        replace_layers: bool = False,
        *,
        lower_list: OpListSource = None,
        fp32_list: OpListSource = None,
        bf16_file_path: str | None = None,
        fp32_file_path: str | None = None,
        opt_level: str | None = None,
        verbose: bool = False,
        hmp_params: Mapping[str, Any] | None = None,
    ) -> None:
        self.precision = validate_precision(precision)  # type: ignore[assignment]
        self.device = device
        lower_list = _seed_alias("bf16_file_path", bf16_file_path, "lower_list", lower_list)
        fp32_list = _seed_alias("fp32_file_path", fp32_file_path, "fp32_list", fp32_list)
        if hmp_params is not None:
            opt_level, verbose, lower_list, fp32_list = _read_hmp_params(
                hmp_params, opt_level, verbose, lower_list, fp32_list
            )
        if opt_level is not None and str(opt_level).upper() != "O1":
            raise ValueError(
                f"opt_level={opt_level!r} is not supported: autocast works like HMP's 'O1' (per-op casting). "
                "Drop opt_level, or pass 'O1'."
            )
        self.verbose = bool(verbose)
        self.op_lists = load_op_lists(lower_list, fp32_list)
        if self.op_lists:
            self._use_op_lists()

        self._init_fp8(recipe, replace_layers)

    def _use_op_lists(self) -> None:
        """Make the given lists the device's (process-wide, as on a Gaudi); refuse where they cannot take effect."""
        from hpu_nb.emulator.hpu_device.autocast import DEFAULT_LOWER_OPS

        shadowed = shadowed_fp32_ops(self.op_lists, DEFAULT_LOWER_OPS)
        if shadowed:
            rank_zero_warn(
                f"fp32_list names {shadowed}, which the lower-precision list in force (Habana's default) also names;"
                " Habana checks the lower list first, so they still run in the lower precision. Pass lower_list= too."
            )
        in_force, note = apply_op_lists(self.op_lists)
        if not in_force:
            raise RuntimeError(f"HPUPrecisionPlugin(lower_list=..., fp32_list=...): {note}")
        if note:
            rank_zero_warn(f"HPUPrecisionPlugin: {note}.")
        if self.verbose:
            rank_zero_info(f"HPUPrecisionPlugin({self.precision!r}): autocast {self.op_lists!r}")

    # -- forward -----------------------------------------------------------------------------------------------
    def autocast_context_manager(self) -> contextlib.AbstractContextManager[None]:
        """The context every training / evaluation / predict step runs in."""
        return autocast_context(self.precision, recipe=self.recipe)

    @contextlib.contextmanager
    @override
    def forward_context(self) -> Generator[None, None, None]:
        with self.autocast_context_manager():
            yield

    def __repr__(self) -> str:
        lists = f", {self.op_lists!r}" if self.op_lists else ""
        return f"{type(self).__name__}(precision={self.precision!r}{lists})"


def _seed_alias(old: str, old_value: Any, new: str, new_value: Any) -> Any:
    if old_value is None:
        return new_value
    if new_value is not None:
        raise ValueError(f"Pass either {old}= or {new}=, not both.")
    warnings.warn(
        f"HPUPrecisionPlugin({old}=...) comes from the HMP era; it is read as {new}= (an autocast op list).",
        DeprecationWarning,
        stacklevel=3,
    )
    return old_value


def _read_hmp_params(
    hmp_params: Mapping[str, Any], opt_level: Any, verbose: bool, bf16: Any, fp32: Any
) -> tuple[Any, bool, Any, Any]:
    unknown = sorted(set(hmp_params) - set(_HMP_KEYS))
    if unknown:
        raise ValueError(f"hmp_params has unknown keys {unknown}; known keys: {', '.join(_HMP_KEYS)}.")
    warnings.warn(
        "hmp_params is deprecated: Habana Mixed Precision (HMP) was replaced by autocast. Its 'bf16_ops' / 'fp32_ops'"
        " files are read as lower_list= / fp32_list=; 'level' must be 'O1'.",
        DeprecationWarning,
        stacklevel=3,
    )
    return (
        hmp_params.get("level", opt_level),
        bool(hmp_params.get("verbose") or verbose),
        hmp_params.get("bf16_ops") or bf16,
        hmp_params.get("fp32_ops") or fp32,
    )

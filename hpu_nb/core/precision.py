"""HPUPrecisionPlugin: mixed precision on Gaudi, real or emulated: autocast on "hpu" with Habana's op lists.

Precisions: "32-true" ("32"), "bf16-mixed" ("bf16"), "16-mixed" and "fp8" (the last two from Gaudi2 on).
Operator lists (LOWER_LIST / FP32_LIST files, or plugin arguments) are applied by hpu_nb.core.oplists.
fp8 training and fp8 inference (measure, then quantize) live in hpu_nb.core.fp8.

Reusable pieces for other precision plugins (e.g. the DeepSpeed one): `validate_precision`, `autocast_context`,
`hpu_autocast`, `autocast_device_type`, and `hpu_nb.core.fp8.convert_modules` / `finalize_measurements`.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from typing import Any, Generator, Iterator, Mapping, Optional, Union

import torch
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from hpu_nb.core.oplists import OpLists, OpListMode, OpListSource, load_op_lists
from hpu_nb.runtime import get_backend

__all__ = [
    "HPUPrecisionPlugin",
    "PRECISION_CHOICES",
    "UnsupportedPrecisionError",
    "autocast_context",
    "autocast_device_type",
    "autocast_dtype",
    "hpu_autocast",
    "validate_precision",
]

# what users may write -> Lightning's unified name
_ALIASES = {
    "32-true": "32-true",
    "32": "32-true",
    "bf16-mixed": "bf16-mixed",
    "bf16": "bf16-mixed",
    "16-mixed": "16-mixed",
    "fp8": "fp8",
}
PRECISION_CHOICES = tuple(_ALIASES)
_HMP_KEYS = ("level", "verbose", "bf16_ops", "fp32_ops")


class UnsupportedPrecisionError(ValueError):
    """This precision cannot run on this Gaudi generation (fp16 / fp8 on first-generation Gaudi)."""


def validate_precision(precision: Any, *, check_device: bool = True) -> str:
    """Lightning's unified precision name for `precision`, or a ValueError listing the choices.

    With `check_device`, "16-mixed" and "fp8" raise UnsupportedPrecisionError on a first-generation Gaudi.
    """
    text = str(precision).strip() if isinstance(precision, (str, int)) and not isinstance(precision, bool) else None
    if text in ("16", "16-true"):
        raise ValueError(
            f"precision={precision!r} is ambiguous on HPU: older Lightning/HMP meant bfloat16 by 16. "
            "Use 'bf16-mixed' for bfloat16 or '16-mixed' for float16 (Gaudi2 and newer)."
        )
    if text not in _ALIASES:
        raise ValueError(
            f"HPUPrecisionPlugin(precision={precision!r}) is not supported. Choose one of: "
            f"{', '.join(PRECISION_CHOICES)}."
        )
    unified = _ALIASES[text]
    if check_device:
        from hpu_nb.core.accelerator import is_fp8_available, is_fp16_available

        check = {"16-mixed": is_fp16_available, "fp8": is_fp8_available}.get(unified)
        if check is not None:
            ok, reason = check()
            if not ok:
                hint = " Use precision='bf16-mixed' instead." if unified == "16-mixed" else ""
                raise UnsupportedPrecisionError(f"precision={precision!r} cannot run here: {reason}{hint}")
    return unified


def autocast_device_type() -> str:
    """The `device_type` for torch.autocast: "hpu", on a Gaudi and on the emulated Gaudi alike."""
    return get_backend().autocast_device_type


def autocast_dtype(precision: str) -> Optional[torch.dtype]:
    """The autocast dtype of a unified precision name (None for full precision). fp8 runs the rest in bf16."""
    return {"bf16-mixed": torch.bfloat16, "fp8": torch.bfloat16, "16-mixed": torch.float16}.get(precision)


@contextlib.contextmanager
def _op_list_mode(lists: Optional[OpLists], device_type: str, verbose: bool = False) -> Iterator[Optional[OpListMode]]:
    if not lists:
        yield None
        return
    with OpListMode(lists, device_type, verbose=verbose) as mode:
        yield mode


@contextlib.contextmanager
def hpu_autocast(
    dtype: torch.dtype = torch.bfloat16,
    enabled: bool = True,
    *,
    op_lists: Optional[OpLists] = None,
    cache_enabled: Optional[bool] = None,
) -> Generator[None, None, None]:
    """torch.autocast on the right device type for this backend, so one model code runs on Gaudi and emulated.

    Works as a context manager and as a decorator. `op_lists` (from hpu_nb.core.oplists.load_op_lists) forces
    listed ops to the lower dtype / fp32 inside the block.
    """
    device_type = autocast_device_type()
    with torch.autocast(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled):
        with _op_list_mode(op_lists, device_type):
            yield


@contextlib.contextmanager
def autocast_context(
    precision: str,
    *,
    op_lists: Optional[OpLists] = None,
    recipe: Any = None,
    verbose: bool = False,
) -> Generator[None, None, None]:
    """The forward context for a unified precision: autocast (+ op lists) (+ fp8 for "fp8"), right for the backend."""
    device_type = autocast_device_type()
    dtype = autocast_dtype(precision)
    with contextlib.ExitStack() as stack:
        if dtype is not None:
            stack.enter_context(torch.autocast(device_type, dtype=dtype, cache_enabled=False))
        # Lists also act on a user's own torch.autocast block under "32-true", as Habana's env lists do.
        stack.enter_context(_op_list_mode(op_lists, device_type, verbose))
        if precision == "fp8":
            from hpu_nb.core.fp8 import fp8_autocast

            stack.enter_context(fp8_autocast(enabled=True, recipe=recipe))
        yield


class HPUPrecisionPlugin(Precision):
    """Mixed precision for HPU: bf16 / fp16 autocast with Habana-style op lists, and fp8 training / inference.

    Args:
        precision: "32-true" / "32", "bf16-mixed" / "bf16", "16-mixed" (Gaudi2+), "fp8" (Gaudi2+).
        device: kept for lightning-habana compatibility; autocast always uses the backend's device type.
        recipe: fp8 recipe (hpu_nb.core.fp8.DelayedScaling, Habana's te.recipe.DelayedScaling, or a dict).
        replace_layers: with precision="fp8", convert_modules() swaps nn.Linear for fp8 layers.
        lower_list / fp32_list: op-list file path or op names; default: the LOWER_LIST / FP32_LIST files.
        bf16_file_path / fp32_file_path / opt_level / verbose / hmp_params: seed (HMP) arguments, still read.
    """

    def __init__(
        self,
        precision: Union[str, int] = "bf16-mixed",
        device: str = "hpu",
        recipe: Any = None,
        replace_layers: bool = False,
        *,
        lower_list: OpListSource = None,
        fp32_list: OpListSource = None,
        bf16_file_path: Optional[str] = None,
        fp32_file_path: Optional[str] = None,
        opt_level: Optional[str] = None,
        verbose: bool = False,
        hmp_params: Optional[Mapping[str, Any]] = None,
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
        for note in self.op_lists.notes:
            if get_backend().is_emulated:
                rank_zero_warn(note)
        if self.verbose and self.op_lists:
            rank_zero_info(f"HPUPrecisionPlugin({self.precision!r}): autocast {self.op_lists!r}")

        if (recipe is not None or replace_layers) and self.precision != "fp8":
            rank_zero_warn(f"precision={self.precision!r} is not 'fp8': recipe and replace_layers are ignored.")
        self.recipe = recipe if self.precision == "fp8" else None
        self.replace_layers = bool(replace_layers) and self.precision == "fp8"
        self._measuring: list[weakref.ref] = []  # models in fp8 measurement mode, written at teardown

    # -- forward -----------------------------------------------------------------------------------------------
    def _lists_to_apply(self) -> Optional[OpLists]:
        # On a Gaudi, Habana's autocast already applies the LOWER_LIST / FP32_LIST files itself.
        if self.op_lists and self.op_lists.from_env and not get_backend().is_emulated:
            return None
        return self.op_lists or None

    def autocast_context_manager(self) -> contextlib.AbstractContextManager[None]:
        """The context every training / evaluation / predict step runs in."""
        return autocast_context(self.precision, op_lists=self._lists_to_apply(), recipe=self.recipe,
                                verbose=self.verbose)

    @contextlib.contextmanager
    def forward_context(self) -> Generator[None, None, None]:
        with self.autocast_context_manager():
            yield

    # -- fp8 ---------------------------------------------------------------------------------------------------
    def convert_modules(
        self,
        module: torch.nn.Module,
        inference: bool = False,
        quant: bool = True,
        fp8_data_path: Optional[str] = None,
        *,
        replace_layers: Optional[bool] = None,
        recipe: Any = None,
    ) -> torch.nn.Module:
        """Prepare `module` for fp8: training layers (replace_layers=True), or inference measure / quantize.

        Returns the model to train / predict with (the same object on the emulated Gaudi).
        """
        if self.precision != "fp8":
            raise ValueError(f"convert_modules() needs HPUPrecisionPlugin(precision='fp8'), not {self.precision!r}.")
        from hpu_nb.core import fp8

        if recipe is not None:
            self.recipe = recipe
        if replace_layers is not None:
            self.replace_layers = bool(replace_layers)
        if not inference and not self.replace_layers:
            rank_zero_warn("convert_modules(): nothing to do; pass replace_layers=True (training) or inference=True.")
            return module
        converted = fp8.convert_modules(
            module,
            replace_layers=self.replace_layers and not inference,
            recipe=self.recipe,
            inference=inference,
            quant=quant,
            fp8_data_path=fp8_data_path,
        )
        if inference and not quant:
            self._measuring.append(weakref.ref(converted))
        return converted

    def finish_measurements(self) -> list:
        """Write the fp8 measurements of the models this plugin set up (the Trainer's teardown does it too)."""
        from hpu_nb.core.fp8 import finalize_measurements

        written = []
        for ref in self._measuring:
            model = ref()
            if model is not None:
                written += finalize_measurements(model)
        return written

    def teardown(self) -> None:
        if self._measuring:
            from hpu_nb.core.fp8 import Fp8InferenceError

            try:
                self.finish_measurements()
            except Fp8InferenceError as err:  # e.g. fit() ran, not predict(): say so, don't fail the teardown
                rank_zero_warn(str(err))
        super().teardown()

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

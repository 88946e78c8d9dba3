"""HPUPrecisionPlugin: choices, selection by the Trainer, real dtypes inside training_step, generations, seed args."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from hpu_nb.core.oplists import OpListError
from hpu_nb.core.precision import (
    HPUPrecisionPlugin,
    UnsupportedPrecisionError,
    autocast_device_type,
    hpu_autocast,
    validate_precision,
)
from hpu_nb.runtime import get_backend
from tests.fake_habana.fixture import fake_gaudi, make_fake_gaudi  # noqa: F401
from tests.helpers.models import LinearModel, quiet_trainer_kwargs, regression_data

FEATURES = 32


def fit(model: L.LightningModule, **trainer_kwargs) -> L.Trainer:
    trainer = L.Trainer(accelerator="hpu", devices=1, **quiet_trainer_kwargs(max_steps=2, **trainer_kwargs))
    trainer.fit(model, regression_data(n=32, features=FEATURES))
    return trainer


@pytest.mark.parametrize(
    "given, unified",
    [("32-true", "32-true"), ("32", "32-true"), (32, "32-true"), ("bf16-mixed", "bf16-mixed"), ("bf16", "bf16-mixed"),
     ("16-mixed", "16-mixed"), ("fp8", "fp8")],
)
def test_accepted_precisions(given, unified) -> None:
    """The plugin keeps the name the user wrote, as lightning-habana's did ('bf16' stays 'bf16': code comparing
    `trainer.precision == "bf16"` keeps its branch); its rules read Lightning's unified name."""
    assert validate_precision(given) == unified
    plugin = HPUPrecisionPlugin(precision=given)
    assert plugin.precision == (given if isinstance(given, str) else unified)
    assert plugin.unified_precision == unified


def test_bf16_autocast_is_for_fp8_only() -> None:
    with pytest.raises(ValueError, match="bf16_autocast=True is for precision='fp8'"):
        HPUPrecisionPlugin("bf16-mixed", bf16_autocast=True)


@pytest.mark.parametrize("given, dtype", [("bf16", torch.bfloat16), ("32", torch.float32)])
def test_the_name_as_written_is_what_the_trainer_reports_and_it_computes_the_same(given, dtype) -> None:
    """trainer.precision is the plugin's name (Lightning reads precision_plugin.precision), as with lightning-habana."""
    model = LinearModel(FEATURES)
    trainer = fit(model, plugins=[HPUPrecisionPlugin(given)])
    assert trainer.precision == given
    assert set(model.seen_dtypes) == {dtype}


@pytest.mark.parametrize("bad", ["64-true", "bf16-true", "transformer-engine", "half", None, True])
def test_other_precisions_list_the_choices(bad) -> None:
    with pytest.raises(ValueError, match=r"Choose one of: 32-true, 32, bf16-mixed, bf16, 16-mixed, fp8"):
        HPUPrecisionPlugin(precision=bad)


def test_16_means_16_mixed_for_the_plugin_as_for_the_trainer() -> None:
    """precision=16 is Lightning's shorthand for "16-mixed" (float16): the plugin reads it the same way, and says
    that Habana's HMP meant bfloat16 by it."""
    with pytest.warns(UserWarning, match="means '16-mixed'.*use 'bf16-mixed'"):
        plugin = HPUPrecisionPlugin(precision=16)
    trainer = L.Trainer(accelerator="hpu", devices=1, precision=16, logger=False, enable_progress_bar=False)
    assert plugin.precision == trainer.precision_plugin.precision == "16-mixed"
    with plugin.forward_context():
        assert torch.nn.Linear(4, 2).to("hpu")(torch.ones(1, 4, device="hpu")).dtype == torch.float16


def test_default_precision_is_32_true_and_fp8_flags_say_what_runs() -> None:
    """As lightning-habana's plugin and Lightning's Precision: no argument is full precision. Its
    fp8_training_available / fp8_inference_available flags are set for "fp8" only."""
    plugin = HPUPrecisionPlugin()
    assert plugin.precision == "32-true"
    with plugin.forward_context():
        assert torch.nn.Linear(4, 2).to("hpu")(torch.ones(1, 4, device="hpu")).dtype == torch.float32
    assert (plugin.fp8_training_available, plugin.fp8_inference_available) == (False, False)
    fp8 = HPUPrecisionPlugin("fp8")
    assert (fp8.fp8_training_available, fp8.fp8_inference_available) == (True, True)  # emulated Gaudi2


def test_fp8_inference_flag_follows_intel_neural_compressor_on_a_gaudi(make_fake_gaudi, monkeypatch) -> None:  # noqa: F811
    """On a Gaudi, fp8 inference runs through Intel Neural Compressor: without it, the flag says so."""
    from hpu_nb.runtime import habana_fp8

    make_fake_gaudi()
    monkeypatch.setattr(habana_fp8, "inc_available", lambda: False)
    plugin = HPUPrecisionPlugin("fp8")
    assert (plugin.fp8_training_available, plugin.fp8_inference_available) == (True, False)
    ok, reason = get_backend().fp8_engine().inference_support()
    assert not ok and "neural-compressor" in reason


def test_trainer_bf16_mixed_gets_the_plugin_and_linear_runs_in_bf16() -> None:
    model = LinearModel(FEATURES)
    trainer = fit(model, precision="bf16-mixed")
    assert isinstance(trainer.precision_plugin, HPUPrecisionPlugin)
    assert trainer.precision_plugin.precision == "bf16-mixed"
    assert model.seen_dtypes and set(model.seen_dtypes) == {torch.bfloat16}
    assert model.layer.weight.dtype == torch.float32  # master weights stay fp32


def test_op_list_arguments_keep_the_linear_output_float32_in_training_step(tmp_path) -> None:
    (tmp_path / "lower.txt").write_text("mm\n")  # replaces Habana's default lower list, which names linear
    (tmp_path / "fp32.txt").write_text("linear\n")
    with pytest.warns(UserWarning, match="a Gaudi reads them only when Habana's software loads"):
        plugin = HPUPrecisionPlugin("bf16-mixed", lower_list=str(tmp_path / "lower.txt"),
                                    fp32_list=str(tmp_path / "fp32.txt"))
    model = LinearModel(FEATURES)
    fit(model, plugins=[plugin])
    assert set(model.seen_dtypes) == {torch.float32}


def test_32_true_is_full_precision_and_16_mixed_is_float16() -> None:
    model = LinearModel(FEATURES)
    fit(model, precision="32-true")
    assert set(model.seen_dtypes) == {torch.float32}
    model = LinearModel(FEATURES)
    fit(model, plugins=[HPUPrecisionPlugin("16-mixed")])
    assert set(model.seen_dtypes) == {torch.float16}


def test_bf16_training_really_lowers_the_math() -> None:
    torch.manual_seed(0)
    layer, x = torch.nn.Linear(64, 64).to("hpu"), torch.randn(8, 64, device="hpu")
    plugin = HPUPrecisionPlugin("bf16-mixed")
    with plugin.forward_context():
        low = layer(x)
    exact = layer(x)
    assert low.dtype == torch.bfloat16 and exact.dtype == torch.float32
    error = ((low.float() - exact).norm() / exact.norm()).item()
    assert 1e-4 < error < 2e-2  # bf16 rounding: visible, small


class LocallyFp32(LinearModel):
    """A documented pattern: a local torch.autocast(enabled=False) block inside a mixed-precision step."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        with torch.autocast(device_type=autocast_device_type(), enabled=False):
            self.seen_dtypes.append(self.layer(x).dtype)
        self.seen_dtypes.append(self.layer(x).dtype)
        return torch.nn.functional.mse_loss(self.layer(x).float(), y)


def test_native_autocast_disables_mixed_precision_for_a_block() -> None:
    model = LocallyFp32(FEATURES)
    fit(model, precision="bf16-mixed")
    assert model.seen_dtypes[:2] == [torch.float32, torch.bfloat16]


class OwnAutocast(LinearModel):
    """Another documented pattern: no plugin, the model turns autocast on itself (device_type picked for us)."""

    @hpu_autocast(torch.bfloat16)
    def forward(self, x):
        return self.layer(x)


def test_hpu_autocast_decorator_under_32_true() -> None:
    model = OwnAutocast(FEATURES)
    fit(model)
    assert set(model.seen_dtypes) == {torch.bfloat16}


@pytest.mark.parametrize("precision", ["16-mixed", "fp8"])
def test_first_generation_gaudi_refuses_fp16_and_fp8(precision, monkeypatch) -> None:
    monkeypatch.setenv("HPU_NB_DEVICE", "gaudi")
    with pytest.raises(UnsupportedPrecisionError, match=r"GAUDI.*Gaudi2 or newer"):
        HPUPrecisionPlugin(precision=precision)
    with pytest.raises(UnsupportedPrecisionError):
        L.Trainer(accelerator="hpu", devices=1, precision=precision if precision != "fp8" else "16-mixed")
    assert HPUPrecisionPlugin("bf16-mixed").precision == "bf16-mixed"


def test_gaudi3_allows_fp8(monkeypatch) -> None:
    monkeypatch.setenv("HPU_NB_DEVICE", "gaudi3")
    assert HPUPrecisionPlugin("fp8").precision == "fp8"


def test_seed_arguments_bf16_and_fp32_file_paths(tmp_path) -> None:
    (tmp_path / "bf16.txt").write_text("softmax\n")
    (tmp_path / "fp32.txt").write_text("linear\n")
    with pytest.warns(DeprecationWarning, match="lower_list"):
        plugin = HPUPrecisionPlugin(
            "bf16-mixed", opt_level="O1", verbose=False,
            bf16_file_path=str(tmp_path / "bf16.txt"), fp32_file_path=str(tmp_path / "fp32.txt"),
        )
    assert plugin.op_lists.lower_ops == {"softmax"} and plugin.op_lists.fp32_ops == {"linear"}
    x = torch.randn(2, 4, device="hpu")
    with plugin.forward_context():
        assert torch.nn.Linear(4, 4).to("hpu")(x).dtype == torch.float32
        assert torch.softmax(x, -1).dtype == torch.bfloat16


def test_hmp_params_are_read_with_a_deprecation(tmp_path) -> None:
    (tmp_path / "fp32.txt").write_text("linear\n")
    with pytest.warns(DeprecationWarning, match="hmp_params is deprecated"):
        plugin = HPUPrecisionPlugin("bf16-mixed", hmp_params={"level": "O1", "verbose": False, "bf16_ops": None,
                                                              "fp32_ops": str(tmp_path / "fp32.txt")})
    assert plugin.op_lists.fp32_ops == {"linear"}
    with pytest.raises(ValueError, match="unknown keys"):
        HPUPrecisionPlugin("bf16-mixed", hmp_params={"lvl": "O1"})
    with pytest.raises(ValueError, match="opt_level='O2'"):
        HPUPrecisionPlugin("bf16-mixed", opt_level="O2")


def test_bad_op_list_fails_at_plugin_creation(tmp_path) -> None:
    with pytest.raises(OpListError, match="expected one op name per line"):
        HPUPrecisionPlugin("bf16-mixed", fp32_list=str(_write(tmp_path / "ops.txt", "linear, mm\n")))


def test_an_unknown_op_name_is_warned_about_when_the_plugin_is_created(monkeypatch) -> None:
    from hpu_nb.core import oplists

    monkeypatch.setattr(oplists, "_warned_unknown", set())
    with pytest.warns(oplists.UnknownOpWarning, match="'lineer'.*Did you mean 'linear'"):
        plugin = HPUPrecisionPlugin("bf16-mixed", fp32_list=["lineer"])
    assert plugin.op_lists.fp32_ops == {"lineer"}


def test_the_plugin_adds_no_function_mode_the_device_applies_the_lists() -> None:
    from torch.overrides import _get_current_function_mode_stack

    with HPUPrecisionPlugin("bf16-mixed").forward_context():
        assert _get_current_function_mode_stack() == []
    with pytest.warns(UserWarning):
        plugin = HPUPrecisionPlugin("bf16-mixed", lower_list=["mm"], fp32_list=["linear"])
    with plugin.forward_context():
        assert _get_current_function_mode_stack() == []


def test_on_a_gaudi_autocast_targets_hpu_and_late_op_lists_are_refused(fake_gaudi, tmp_path) -> None:  # noqa: F811
    assert autocast_device_type() == "hpu"
    with HPUPrecisionPlugin("bf16-mixed").forward_context():
        assert torch.is_autocast_enabled("hpu") and torch.get_autocast_dtype("hpu") == torch.bfloat16
        assert not torch.is_autocast_enabled("cpu")
    # Habana read its op lists when it loaded: a plugin cannot change them in this process (rank 0 would train with
    # other lists than the workers it starts)
    with pytest.raises(RuntimeError, match="before PT_HPU_AUTOCAST_FP32_OPS_LIST=.* was set"):
        HPUPrecisionPlugin("bf16-mixed", fp32_list=["matmul"])


def test_on_a_gaudi_op_lists_set_before_start_are_in_force(make_fake_gaudi, tmp_path, monkeypatch) -> None:  # noqa: F811
    ops = tmp_path / "fp32.txt"
    ops.write_text("cumsum\n")
    monkeypatch.setenv("PT_HPU_AUTOCAST_FP32_OPS_LIST", str(ops))
    make_fake_gaudi(release="1.21.0")
    plugin = HPUPrecisionPlugin("bf16-mixed", fp32_list=str(ops))  # the same file Habana read: nothing to refuse
    assert plugin.op_lists.fp32_ops == {"cumsum"}


def _write(path, text: str):
    path.write_text(text)
    return path


def test_the_op_list_warnings_point_at_the_line_that_built_the_plugin() -> None:
    """Issue 39: tutorial 02 showed hpu_nb's own file and its `rank_zero_warn(...)` line; the user's line now."""
    import warnings

    from hpu_nb import HPUPrecisionPlugin

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        HPUPrecisionPlugin("bf16-mixed", fp32_list=["linear"])  # the line the warnings name
    here = [w for w in caught if "fp32_list names" in str(w.message) or "op lists now" in str(w.message)]
    assert here and all(w.filename == __file__ for w in here), [(w.filename, w.lineno) for w in caught]

"""TrainerConfig / TrainerConfigWidget: validation, and generated code == L.Trainer(**cfg.trainer_kwargs()).

The exhaustive test runs every combination of strategy (with each ZeRO stage and offload), device count,
precision (with each autocast style and op lists), accelerator style, profiler and monitor: it executes the
generated code in a fresh namespace and compares the Trainer with the one built from trainer_kwargs().
"""

from __future__ import annotations

import importlib
import itertools
import os
import textwrap
import warnings
from typing import Any

import lightning as L
import pytest
import torch

from hpu_nb.core.trainer_config import InvalidConfigError, TrainerConfig, parse_op_list
from tests.models import LinearModel, regression_data

QUIET = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False}
FEATURES = 32

STRATEGY_VARIANTS = [("auto", 2, False), ("single", 2, False), ("parallel", 2, False), ("ddp", 2, False),
                     ("fsdp", 2, False)] + [("deepspeed", s, o) for s in (0, 1, 2, 3) for o in (False, True)]
PRECISION_VARIANTS = [
    ("32-true", "plugin", None, None), ("32-true", "context", None, None),
    ("bf16-mixed", "plugin", None, None), ("bf16-mixed", "context", None, None),
    ("bf16-mixed", "decorator", None, None), ("bf16-mixed", "plugin", ["linear", "matmul"], ["softmax"]),
    ("16-mixed", "plugin", None, None), ("16-mixed", "context", None, None), ("16-mixed", "decorator", None, None),
    ("16-mixed", "plugin", ["linear"], ["sum"]),
    ("fp8", "plugin", None, None), ("fp8-measure", "plugin", None, None), ("fp8-quantize", "plugin", None, None),
]


def _missing(cfg: TrainerConfig) -> list[str]:
    hpu_nb = importlib.import_module("hpu_nb")
    missing = []
    for name in cfg.required_names():
        try:
            getattr(hpu_nb, name)
        except (AttributeError, ImportError):
            missing.append(name)
    return missing


def _describe(trainer: L.Trainer) -> dict[str, Any]:
    plugin = trainer.precision_plugin
    strategy = trainer.strategy
    facts: dict[str, Any] = {
        "accelerator": type(trainer.accelerator),
        "strategy": type(strategy),
        "plugin": type(plugin),
        "precision": getattr(plugin, "precision", None),
        "devices": trainer.num_devices,
        "profiler": type(trainer.profiler),
        "callbacks": sorted(type(cb).__name__ for cb in trainer.callbacks),
        "max_epochs": trainer.max_epochs,
    }
    lists = getattr(plugin, "op_lists", None)
    if lists is not None:
        facts["lower_ops"], facts["fp32_ops"] = sorted(lists.lower_ops), sorted(lists.fp32_ops)
    config = getattr(strategy, "config", None)
    if isinstance(config, dict) and "zero_optimization" in config:
        zero = config["zero_optimization"]
        facts["zero"] = (zero.get("stage"), "offload_optimizer" in zero)
    return facts


def _module_types(model: torch.nn.Module) -> list[str]:
    return [f"{name}:{type(m).__name__}" for name, m in model.named_modules()]


def _new_fp8_process(cfg: TrainerConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """Quantizing happens in a new process after measuring (as on a Gaudi): start each quantize step as one."""
    if cfg.precision == "fp8-quantize":
        from hpu_nb.core.fp8 import inference

        monkeypatch.setattr(inference, "_measured_in_this_process", False)


@pytest.fixture(scope="module")
def fp8_measurements(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Measurements of LinearModel(FEATURES) for the fp8-quantize combinations: the generated fp8-measure code,
    run with trainer.predict in another process (measure and quantize never share a process, as on a Gaudi)."""
    import subprocess
    import sys
    from pathlib import Path

    path = str(tmp_path_factory.mktemp("fp8") / "fp8_data")
    cfg = TrainerConfig(precision="fp8-measure", fp8_data_path=path, extra=dict(QUIET))
    script = "\n".join([
        "from tests.models import LinearModel, regression_data",
        f"model = LinearModel({FEATURES})",
        cfg.code,
        f"trainer.predict(model, regression_data(n=16, features={FEATURES}))",
    ])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPU_NB_", "PT_HPU_", "QUANT_CONFIG"))}
    done = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parent.parent, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return path


@pytest.mark.parametrize("strategy,stage,offload", STRATEGY_VARIANTS,
                         ids=[f"{s}{'-zero' + str(z) + ('-offload' if o else '') if s == 'deepspeed' else ''}"
                              for s, z, o in STRATEGY_VARIANTS])
def test_generated_code_builds_the_same_trainer(strategy: str, stage: int, offload: bool, fp8_measurements: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    if strategy == "fsdp":
        monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")  # FSDP is eager-only (the lazy case is checked below)
    checked = invalid = 0
    skipped: set[str] = set()
    for (precision, autocast, lower, fp32), devices, accelerator, profiler, monitor in itertools.product(
        PRECISION_VARIANTS, (1, 2), ("hpu", "HPUAccelerator()"), (False, True), (False, True)
    ):
        cfg = TrainerConfig(accelerator=accelerator, devices=devices, strategy=strategy, deepspeed_stage=stage,
                            offload_optimizer=offload, precision=precision, autocast=autocast, lower_list=lower,
                            fp32_list=fp32, fp8_data_path=fp8_measurements, profiler=profiler, monitor=monitor,
                            extra={**QUIET, "max_epochs": 3})
        code = cfg.code
        compile(code, "<generated>", "exec")  # always valid Python, errors or not
        if cfg.errors:
            invalid += 1
            assert code.startswith("# This configuration has errors")
            with pytest.raises(InvalidConfigError, match=cfg.errors[0].field):
                cfg.trainer_kwargs(LinearModel(FEATURES))
            continue
        missing = _missing(cfg)
        if missing:
            skipped.update(missing)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            namespace: dict[str, Any] = {"model": LinearModel(FEATURES)} if cfg.needs_model else {}
            _new_fp8_process(cfg, monkeypatch)
            exec(code, namespace)  # noqa: S102 - the generated code, in a fresh namespace
            _new_fp8_process(cfg, monkeypatch)
            kwargs, model = cfg.build(LinearModel(FEATURES) if cfg.needs_model else None)
            expected = L.Trainer(**kwargs)
        got = namespace["trainer"]
        assert isinstance(got, L.Trainer), code
        assert _describe(got) == _describe(expected), code
        if cfg.needs_model:
            assert _module_types(namespace["model"]) == _module_types(model), code
        checked += 1
    print(f"\n{strategy}: {checked} combinations equal, {invalid} rejected by validation"
          + (f", skipped (missing classes): {sorted(skipped)}" if skipped else ""))
    if checked == 0 and skipped:
        pytest.skip(f"{strategy}: needs {', '.join(sorted(skipped))}, which this installation lacks")
    assert checked > 0 or strategy in ("fsdp", "deepspeed"), f"no valid combination for {strategy}"


def test_valid_combinations_really_train() -> None:
    """Beyond construction: a few generated configurations fit a model on the emulated Gaudi."""
    for cfg in (TrainerConfig(precision="bf16-mixed", lower_list=["linear"], monitor=True, extra=dict(QUIET, max_epochs=1)),
                TrainerConfig(precision="fp8", extra=dict(QUIET, max_epochs=1))):
        namespace: dict[str, Any] = {"model": LinearModel(FEATURES)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exec(cfg.code, namespace)  # noqa: S102
            namespace["trainer"].fit(namespace["model"], regression_data(n=32, features=FEATURES))
        assert namespace["trainer"].state.finished
        assert namespace["trainer"].global_step == 2


def test_validation_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    def errors(**kw: Any) -> list[str]:
        return [f"{i.field}: {i.message}" for i in TrainerConfig(**kw).errors]

    assert errors() == []
    assert any("only 8 are available" in e and "HPU_NB_DEVICE_COUNT" in e for e in errors(devices=9))
    assert any("single-device strategy" in e for e in errors(strategy="single", devices=2))
    assert errors(strategy="fsdp", devices=2) == []  # eager by default, as today's Gaudi software
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    assert any("PT_HPU_LAZY_MODE=0" in e for e in errors(strategy="fsdp", devices=2))
    monkeypatch.delenv("PT_HPU_LAZY_MODE")
    assert any("offload needs ZeRO stage 1, 2 or 3" in e for e in errors(strategy="deepspeed", deepspeed_stage=0,
                                                                           offload_optimizer=True))
    assert any("in both lists" in e for e in errors(precision="bf16-mixed", lower_list=["linear"], fp32_list=["linear"]))
    assert any("act on bf16-mixed / 16-mixed" in e for e in errors(precision="32-true", lower_list=["linear"]))
    assert any("fp8 runs through HPUPrecisionPlugin" in e for e in errors(precision="fp8", autocast="context"))
    assert any("fp8 is not available with the deepspeed" in e for e in errors(precision="fp8", strategy="deepspeed"))
    assert any("not one of" in e for e in errors(precision="fp4"))
    monkeypatch.setenv("HPU_NB_DEVICE", "gaudi")
    from hpu_nb.runtime import reset_backend

    reset_backend()
    assert any("fp16 is not supported on GAUDI" in e for e in errors(precision="16-mixed"))
    assert any("fp8 is not supported on GAUDI" in e for e in errors(precision="fp8-measure"))
    assert errors(precision="bf16-mixed") == []


def test_deepspeed_missing_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name, *a))
    cfg = TrainerConfig(strategy="deepspeed", devices=2)
    assert any("DeepSpeed is not installed" in i.message for i in cfg.errors)
    with pytest.raises(InvalidConfigError, match="DeepSpeed is not installed"):
        cfg.trainer_kwargs()


def test_fp8_needs_the_model() -> None:
    with pytest.raises(InvalidConfigError, match="converts your model"):
        TrainerConfig(precision="fp8").trainer_kwargs()


@pytest.mark.parametrize("style", ["context", "decorator"])
def test_autocast_snippet_runs_in_bf16(style: str) -> None:
    cfg = TrainerConfig(precision="bf16-mixed", autocast=style)
    lines = [line[1:] for line in cfg.code.splitlines() if line.startswith("#     ") or line == "#"]
    snippet = textwrap.dedent("\n".join(lines))
    assert 'torch.autocast(device_type="hpu", dtype=torch.bfloat16)' in snippet
    namespace: dict[str, Any] = {"L": L}
    exec(snippet, namespace)  # noqa: S102 - the snippet the user pastes into their module
    model = namespace["MyModel"]()
    model.net = torch.nn.Linear(4, 4).to("hpu")
    assert model(torch.randn(2, 4, device="hpu")).dtype == torch.bfloat16


def test_op_list_parsing() -> None:
    assert parse_op_list("linear, matmul softmax") == ["linear", "matmul", "softmax"]
    assert parse_op_list("ops/bf16.txt") == "ops/bf16.txt" and parse_op_list("ops.txt") == "ops.txt"
    assert parse_op_list("  ") is None


def test_widget_presets_clicks_and_code() -> None:
    from hpu_nb.notebook.config_widget import PrecisionConfigWidget, TrainerConfigWidget

    cfg = TrainerConfigWidget(precision="bf16-mixed", devices=2)
    assert cfg.controls["precision"].value == "bf16-mixed" and cfg.controls["devices"].value == 2
    assert 'devices=2' in cfg.code and cfg.panel.code == cfg.code
    cfg.controls["strategy"].value = "single"  # a click: invalid with 2 devices
    assert cfg.panel.issues and cfg.panel.issues[0]["field"] == "strategy"
    assert "hpu-cfg-invalid" in cfg.controls["strategy"]._dom_classes
    cfg.controls["devices"].value = 1
    assert not [i for i in cfg.panel.issues if i["level"] == "error"]
    assert "hpu-cfg-invalid" not in cfg.controls["strategy"]._dom_classes
    assert 'strategy="hpu_single"' in cfg.panel.code
    assert cfg.controls["deepspeed_stage"].disabled and not cfg.controls["lower_list"].disabled
    cfg.controls["lower_list"].value = "linear, matmul"
    assert cfg.config.lower_list == ["linear", "matmul"]
    assert 'lower_list=["linear", "matmul"]' in cfg.code
    cfg.controls["strategy"].value = "deepspeed"
    assert not cfg.controls["deepspeed_stage"].disabled
    cfg.set(strategy="auto", monitor=True)
    assert cfg.controls["monitor"].value is True and "callbacks=[MemoryMonitor()]" in cfg.code
    trainer = L.Trainer(**cfg.trainer_kwargs(), **QUIET)
    assert type(trainer.precision_plugin).__name__ == "HPUPrecisionPlugin"
    assert sorted(trainer.precision_plugin.op_lists.lower_ops) == ["linear", "matmul"]
    data = cfg._repr_mimebundle_()
    data = data[0] if isinstance(data, tuple) else data
    assert "application/vnd.jupyter.widget-view+json" in data
    assert "trainer = L.Trainer(" in data["text/plain"] and "<pre>" in data["text/html"]
    with pytest.raises(TypeError, match="Unknown TrainerConfig field"):
        TrainerConfigWidget(precison="bf16-mixed")
    small = PrecisionConfigWidget(precision="fp8-measure", fp8_data_path="measure_here")
    assert set(small.controls) == {"precision", "autocast", "lower_list", "fp32_list", "fp8_data_path"}
    assert 'fp8_data_path="measure_here"' in small.code and small.controls["autocast"].disabled


def test_insert_cell_uses_set_next_input(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a kernel, set_next_input becomes the payload JupyterLab turns into a new cell (the browser test sees it)."""
    from IPython.core.interactiveshell import InteractiveShell

    from hpu_nb.notebook.config_widget import TrainerConfigWidget

    ip = InteractiveShell.instance()
    calls = []
    monkeypatch.setattr(ip, "set_next_input", lambda text, replace=False: calls.append((text, replace)))
    cfg = TrainerConfigWidget(precision="bf16-mixed")
    cfg.insert_cell()
    assert calls == [(cfg.code, False)]

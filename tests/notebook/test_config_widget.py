"""TrainerConfig / TrainerConfigWidget: validation, the generated code builds the same Trainer, and trains.

`trainer_config_runs.combinations()` is every combination of strategy (with each ZeRO stage and offload), device
count, precision (with each autocast style and op lists), accelerator form, profiler and monitor. For each valid one:
the generated code builds the same Trainer as `cfg.build()` (here), and it trains (in `trainer_config_runs`, started
once per group of device count and execution mode). No error ever names a field the form has disabled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from hpu_nb.notebook.trainer_config import InvalidConfigError, TrainerConfig, parse_op_list
from hpu_nb.runtime import reset_backend
from tests.helpers.models import LinearModel
from tests.helpers.trainer_config_runs import FEATURES, QUIET, STRATEGY_VARIANTS, combinations, key, selected

ROOT = Path(__file__).resolve().parents[2]
HELPERS = ROOT / "tests" / "helpers"


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


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("HPU_NB_", "PT_HPU_", "QUANT_CONFIG"))}


@pytest.fixture(scope="module")
def fp8_measurements(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Measurements of LinearModel(FEATURES) for the fp8-quantize combinations: the generated fp8-measure code,
    run with trainer.predict in another process (measure and quantize never share a process, as on a Gaudi).
    Measured twice, as Intel Neural Compressor names the files: in a plain process (no rank suffix), and as the one
    worker torchrun starts for devices=1 (LOCAL_RANK=0, WORLD_SIZE=1: `_0_1`), where the 1-card runs quantize."""
    path = str(tmp_path_factory.mktemp("fp8") / "fp8_data")
    cfg = TrainerConfig(precision="fp8-measure", fp8_data_path=path, extra=dict(QUIET))
    script = "\n".join([
        "from tests.helpers.models import LinearModel, regression_data",
        f"model = LinearModel({FEATURES})",
        cfg.code,
        f"trainer.predict(model, regression_data(n=16, features={FEATURES}))",
    ])
    for launcher_env in ({}, {"LOCAL_RANK": "0", "WORLD_SIZE": "1"}):
        done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env={**_clean_env(), **launcher_env},
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
    written = sorted(p.name for p in (Path(path) / "inc_output").glob("measure_hooks_maxabs*.json")
                     if not p.name.endswith("_mod_list.json"))  # (INC's module lists beside them)
    assert written == ["measure_hooks_maxabs.json", "measure_hooks_maxabs_0_1.json"], written
    return path


@pytest.mark.parametrize("lazy", ["1", "0"])
def test_no_error_names_a_disabled_control(lazy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The form disables what does not matter (`relevant`); an error about a disabled control would be a dead end."""
    monkeypatch.setenv("PT_HPU_LAZY_MODE", lazy)
    reset_backend()
    seen = valid = 0
    for values in combinations():
        cfg = TrainerConfig(**values)
        for issue in cfg.errors:
            assert issue.field == "extra" or cfg.relevant(issue.field), (issue, values)
        seen += 1
        valid += not cfg.errors
    assert seen == 2 * 2 * 2 * 2 * len(STRATEGY_VARIANTS) * 13 and 0 < valid < seen


def test_the_reported_dead_end_is_gone() -> None:
    """torch.autocast, then fp8 inference: the autocast style no longer matters, so it is neither an error nor
    enabled.
    """
    from hpu_nb.notebook.config_widget import TrainerConfigWidget

    cfg = TrainerConfigWidget(precision="bf16-mixed")
    cfg.controls["autocast"].value = "context"
    cfg.controls["precision"].value = "fp8-measure"
    assert cfg.controls["autocast"].disabled and not cfg.config.errors
    assert "model = plugin.convert_modules(\n    model,\n    inference=True,\n    quant=False," in cfg.code
    assert "torch.autocast" not in cfg.code
    for name, control in cfg.controls.items():
        if any(i["field"] == name for i in cfg.panel.issues if i["level"] == "error"):
            assert not control.disabled, name


ONE_FORM = {("hpu", False, False), ("HPUAccelerator()", True, True)}


@pytest.mark.parametrize("strategy,stage,offload", STRATEGY_VARIANTS,
                         ids=[f"{s}{'-zero' + str(z) + ('-offload' if o else '') if s == 'deepspeed' else ''}"
                              for s, z, o in STRATEGY_VARIANTS])
def test_generated_code_builds_the_same_trainer(strategy: str, stage: int, offload: bool, fp8_measurements: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    if strategy == "fsdp":
        monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")  # FSDP is eager-only (the lazy case is an error, tested above)
        reset_backend()
    checked = invalid = 0
    for values in combinations(fp8_data_path=fp8_measurements, extra={**QUIET, "max_epochs": 3}):
        if (values["strategy"], values["deepspeed_stage"], values["offload_optimizer"]) != (strategy, stage, offload):
            continue
        if (values["accelerator"], values["profiler"], values["monitor"]) not in ONE_FORM:
            continue  # construction: orthogonal choices all off or all on; every one of them trains (below)
        cfg = TrainerConfig(**values)
        code = cfg.code
        compile(code, "<generated>", "exec")  # always valid Python, errors or not
        if cfg.errors:
            invalid += 1
            assert code.startswith("# This configuration has errors")
            with pytest.raises(InvalidConfigError, match=cfg.errors[0].field):
                cfg.trainer_kwargs(LinearModel(FEATURES))
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            namespace: dict[str, Any] = {"model": LinearModel(FEATURES)} if cfg.needs_model else {}
            exec(code, namespace)
            kwargs, model = cfg.build(LinearModel(FEATURES) if cfg.needs_model else None)
            expected = L.Trainer(**kwargs)
        got = namespace["trainer"]
        assert isinstance(got, L.Trainer), code
        assert _describe(got) == _describe(expected), code
        if cfg.needs_model:
            assert _module_types(namespace["model"]) == _module_types(model), code
        if cfg.offloads:  # the optimizer is the user's to paste: a snippet, never a patched configure_optimizers
            assert "return DeepSpeedCPUAdam(self.parameters()" in code and "lambda" not in code
        checked += 1
    assert checked > 0 and invalid > 0, (checked, invalid)


# groups: (ranks, PT_HPU_LAZY_MODE, strategies); FSDP is eager-only, everything else runs in the default lazy mode
FAST, SLOW = "auto,single,parallel,ddp", "deepspeed"
TRAIN_GROUPS = [(1, "1", FAST, "all"), (1, "1", SLOW, "two"), (1, "0", "fsdp", "two"),
                (2, "1", FAST, "all"), (2, "1", SLOW, "two"), (2, "0", "fsdp", "two")]


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("ranks,lazy,strategies,forms", TRAIN_GROUPS,
                         ids=[f"{r}dev-{s.split(',')[0]}" for r, _, s, _ in TRAIN_GROUPS])
def test_every_valid_combination_trains(ranks: int, lazy: str, strategies: str, forms: str, fp8_measurements: str,
                                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The generated code of every valid combination, executed as a user would, fits two steps (or predicts)."""
    monkeypatch.setenv("PT_HPU_LAZY_MODE", lazy)
    reset_backend()
    wanted = {key(v) for v in selected(combinations((ranks,)), set(strategies.split(",")), forms)}
    out = tmp_path / "results.jsonl"
    env = dict(_clean_env(), PT_HPU_LAZY_MODE=lazy, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--master_addr=127.0.0.1",
           f"--master_port={_free_port()}", str(HELPERS / "trainer_config_runs.py"), "--out", str(out),
           "--fp8", fp8_measurements, "--only", strategies, "--forms", forms]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1400)
    assert done.returncode == 0 and out.exists(), done.stderr[-4000:]
    results = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    failed = [r for r in results if not r["ok"]]
    assert not failed, "\n\n".join(f"{r['key']}\n{r.get('trace', r)}" for r in failed[:3])
    assert {r["key"] for r in results} == wanted and len(results) == len(wanted)
    ran = sorted(r["seconds"] for r in results if "same_program_as" not in r)
    print(f"\n{len(results)} combinations, {len(ran)} distinct programs trained; max {ran[-1]:.1f} s")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    assert errors(strategy="deepspeed", deepspeed_stage=0, offload_optimizer=True) == []  # offload: not at stage 0
    assert not TrainerConfig(strategy="deepspeed", deepspeed_stage=0, offload_optimizer=True).offloads
    assert any("in both lists" in e
               for e in errors(precision="bf16-mixed", lower_list=["linear"], fp32_list=["linear"]))
    ignored = TrainerConfig(precision="32-true", lower_list=["linear"])
    assert not ignored.errors and "op lists are not used" in ignored.warnings[0].message
    assert "lower_list" not in ignored.code
    assert errors(precision="fp8", autocast="context") == []  # the autocast style does not matter for fp8
    assert any("quantized fp8 inference runs on one device" in e
               for e in errors(precision="fp8-quantize", strategy="parallel"))
    assert any("fp8 is not available with the fsdp" in e for e in errors(precision="fp8", strategy="fsdp"))
    for precision in ("fp8", "fp8-measure", "fp8-quantize"):  # DeepSpeed runs fp8 with HPUDeepSpeedPrecisionPlugin
        deepspeed_fp8 = TrainerConfig(precision=precision, strategy="deepspeed")
        assert deepspeed_fp8.errors == [] and "plugin = HPUDeepSpeedPrecisionPlugin(precision=\"fp8\")" in \
            deepspeed_fp8.code
    assert errors(precision="fp8-measure", strategy="deepspeed", devices=2) == []
    assert errors(precision="fp8", strategy="deepspeed", deepspeed_stage=3) == []  # training: ZeRO-3 too
    for precision in ("fp8-measure", "fp8-quantize"):
        assert any("ZeRO-3 partitions them" in e
                   for e in errors(precision=precision, strategy="deepspeed", deepspeed_stage=3))
    no_path = TrainerConfig(precision="fp8-quantize", fp8_data_path=" ")  # the default directory
    assert no_path.errors == [] and "fp8_data_path" not in no_path.code
    assert "<cache directory>/fp8" in no_path.warnings[0].message
    assert any("quantized fp8 inference runs on one device" in e
               for e in errors(precision="fp8-quantize", strategy="deepspeed", devices=2))
    assert any("not one of" in e for e in errors(precision="fp4"))
    monkeypatch.setenv("HPU_NB_DEVICE", "gaudi")
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


def test_fp8_needs_the_model_and_says_what_it_is() -> None:
    with pytest.raises(InvalidConfigError, match="converts your model"):
        TrainerConfig(precision="fp8").trainer_kwargs()
    code = TrainerConfig(precision="fp8").code
    assert "# `model`: your LightningModule, made before this code (model = MyModel())" in code
    assert code.index("`model`: your LightningModule") < code.index("model = plugin.convert_modules(model")
    for precision in ("fp8", "fp8-measure", "fp8-quantize"):  # the lines fit the code panel beside the form
        code = TrainerConfig(precision=precision, fp8_data_path="/data/measurements/of/my/model").code
        assert max(len(line) for line in code.splitlines()) <= 80, code
        compile(code, "<generated>", "exec")


def test_offload_code_is_a_configure_optimizers_snippet_to_paste() -> None:
    """ZeRO-Offload: the optimizer returned from configure_optimizers, as a Lightning user writes it (no lambda)."""
    offload = TrainerConfig(strategy="deepspeed", deepspeed_stage=2, offload_optimizer=True, offload_lr=0.01)
    assert not offload.needs_model and "lambda" not in offload.code and "model." not in offload.code
    assert max(len(line) for line in offload.offload_snippet()) <= 80
    kwargs = offload.trainer_kwargs()  # no model needed: the Trainer is the same whatever the module
    assert kwargs["strategy"].config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    lines = [line[1:] for line in offload.code.splitlines() if line.startswith("#     ") or line == "#"]
    snippet = textwrap.dedent("\n".join(lines))
    namespace: dict[str, Any] = {"L": L}
    exec(snippet, namespace)
    made: list[tuple[list, float]] = []
    namespace["DeepSpeedCPUAdam"] = lambda params, lr: made.append((list(params), lr)) or "the optimizer"
    model = namespace["MyModel"]()
    model.net = torch.nn.Linear(4, 4)
    assert model.configure_optimizers() == "the optimizer"
    assert made == [(list(model.parameters()), 0.01)]
    assert TrainerConfig(strategy="deepspeed", deepspeed_stage=0, offload_optimizer=True).offload_snippet() == []


def test_zero3_warning_follows_the_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """ZeRO-3 on Gaudi2 needs SynapseAI 1.19: the emulated release (1.21) gets no warning, an older one does."""
    from hpu_nb.runtime import get_backend
    from hpu_nb.runtime.generations import Release

    monkeypatch.setenv("HPU_NB_DEVICE", "gaudi2")
    reset_backend()
    try:
        zero3 = TrainerConfig(strategy="deepspeed", deepspeed_stage=3, devices=2)
        assert not [i for i in zero3.issues() if i.field == "deepspeed_stage"]
        monkeypatch.setattr(type(get_backend()), "release", lambda self: Release(1, 18))
        assert [i.message for i in zero3.issues() if i.field == "deepspeed_stage"] == [
            "ZeRO-3 on Gaudi2 needs SynapseAI 1.19 or newer (this is 1.18)."]
    finally:
        monkeypatch.undo()
        reset_backend()


@pytest.mark.parametrize("style", ["context", "decorator"])
def test_autocast_snippet_runs_in_bf16(style: str) -> None:
    cfg = TrainerConfig(precision="bf16-mixed", autocast=style)
    lines = [line[1:] for line in cfg.code.splitlines() if line.startswith("#     ") or line == "#"]
    snippet = textwrap.dedent("\n".join(lines))
    assert 'torch.autocast(device_type="hpu", dtype=torch.bfloat16)' in snippet
    namespace: dict[str, Any] = {"L": L}
    exec(snippet, namespace)
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
    trainer = L.Trainer(**{**cfg.trainer_kwargs(), **QUIET})  # the form's logger and checkpointing: QUIET's here
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
    invalid = TrainerConfigWidget(strategy="fsdp", precision="fp8", devices=2)  # FSDP + fp8: code that would raise
    assert invalid.config.errors
    with pytest.raises(InvalidConfigError, match="errors"):
        invalid.insert_cell()
    assert len(calls) == 1


def test_the_one_device_advice_is_true_for_the_chosen_combination() -> None:
    def strategy_warnings(**kw: Any) -> list[str]:
        return [w.message for w in TrainerConfig(devices=1, **kw).warnings if w.field == "strategy"]

    (plain,) = strategy_warnings(strategy="deepspeed", deepspeed_stage=2)
    assert "'single' does the same" in plain
    (offload,) = strategy_warnings(strategy="deepspeed", deepspeed_stage=3, offload_optimizer=True)
    assert "'single' does the same" not in offload and "ZeRO-Offload" in offload and "'single' does not" in offload
    assert strategy_warnings(strategy="single") == []


@pytest.mark.parametrize("strategy,stage,offload", STRATEGY_VARIANTS,
                         ids=[f"{s}{'-zero' + str(z) + ('-offload' if o else '') if s == 'deepspeed' else ''}"
                              for s, z, o in STRATEGY_VARIANTS])
def test_generated_code_is_bounded_for_every_strategy(strategy: str, stage: int, offload: bool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 31: a newcomer's first fit ends: the code of every strategy sets max_epochs (3 unless changed), says
    why in a comment, and the Trainer it builds has that bound (Lightning's own default is 1000 epochs)."""
    if strategy == "fsdp":
        monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
        reset_backend()
    assert L.Trainer(accelerator="cpu", **QUIET).max_epochs is None  # no bound: fit runs Lightning's 1000 epochs
    for devices, epochs in ((1, None), (2, 7)):
        values = dict(strategy=strategy, deepspeed_stage=stage, offload_optimizer=offload, devices=devices,
                      extra=dict(QUIET))
        cfg = TrainerConfig(**values) if epochs is None else TrainerConfig(max_epochs=epochs, **values)
        if cfg.errors:  # e.g. the single-device strategy on 2 devices
            continue
        code = cfg.code
        assert f"max_epochs={epochs or 3}," in code and "Lightning's default is 1000 epochs" in code, code
        namespace: dict[str, Any] = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exec(code, namespace)
        assert namespace["trainer"].max_epochs == (epochs or 3), code
    assert TrainerConfig(max_epochs=0).errors[0].field == "max_epochs"


def test_extra_may_set_the_bound_itself() -> None:
    """`extra={"max_epochs": ...}` (as tutorials and tests pass it) wins over the form's, and the comment goes."""
    code = TrainerConfig(extra={"max_epochs": 1, "max_steps": 5}).code
    assert code.count("max_epochs=") == 1 and "max_epochs=1," in code and "1000 epochs" not in code
    assert "max_steps=5," in code


def test_the_epochs_control_writes_the_bound() -> None:
    from hpu_nb.notebook.config_widget import TrainerConfigWidget

    cfg = TrainerConfigWidget()
    assert cfg.controls["max_epochs"].value == 3 and "max_epochs=3," in cfg.panel.code
    cfg.controls["max_epochs"].value = 5
    assert cfg.config.max_epochs == 5 and "max_epochs=5," in cfg.panel.code
    assert cfg.trainer_kwargs()["max_epochs"] == 5
    cfg.controls["max_epochs"].value = 0
    assert [i["field"] for i in cfg.panel.issues if i["level"] == "error"] == ["max_epochs"]
    assert "hpu-cfg-invalid" in cfg.controls["max_epochs"]._dom_classes


def test_one_field_declaration_adds_a_control() -> None:
    """Issue 30: the form's fields are listed once. A field declared with a control (here gradient accumulation, a
    plain Trainer argument) is a row of the form, validated, in the code, and in the Trainer it builds."""
    import dataclasses

    from hpu_nb.notebook.config_widget import TrainerConfigWidget
    from hpu_nb.notebook.trainer_config import control

    @dataclasses.dataclass
    class WithAccumulation(TrainerConfig):
        accumulate_grad_batches: int = dataclasses.field(default=1, metadata=control(
            "grad. accumulation", "int", minimum=1, trainer_argument=True))

    cfg = TrainerConfigWidget(WithAccumulation(accumulate_grad_batches=4, extra=dict(QUIET)))
    assert cfg.controls["accumulate_grad_batches"].value == 4
    cfg.controls["accumulate_grad_batches"].value = 2
    namespace: dict[str, Any] = {}
    exec(cfg.code, namespace)
    assert namespace["trainer"].accumulate_grad_batches == 2
    assert cfg.set(accumulate_grad_batches=3).controls["accumulate_grad_batches"].value == 3
    cfg.controls["accumulate_grad_batches"].value = 0
    assert [i.field for i in cfg.config.errors] == ["accumulate_grad_batches"]


def test_the_panel_knows_its_form_for_insert_below() -> None:
    """Insert below (static/config_widget.js) finds the form's cell by the form's widget model id."""
    from hpu_nb.notebook.config_widget import PrecisionConfigWidget, TrainerConfigWidget

    for cfg in (TrainerConfigWidget(), PrecisionConfigWidget()):
        assert cfg.panel.form_id and cfg.panel.form_id == cfg.model_id
    script = (ROOT / "hpu_nb" / "notebook" / "static" / "config_widget.js").read_text()
    assert "hpu-cfg-insert" in script and "insertCell(index + 1" in script


def _built(cfg: TrainerConfig) -> L.Trainer:
    namespace: dict[str, Any] = {"model": LinearModel(FEATURES)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(cfg.code, namespace)
    return namespace["trainer"]


@pytest.mark.parametrize("strategy", ["deepspeed", "fsdp"])
def test_the_autocast_advice_says_what_the_code_does(strategy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Autocast in the user's code with DeepSpeed / FSDP: the advice names the plugin and precision the code's
    Trainer really has (32-true), not "manages precision itself"."""
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    reset_backend()
    cfg = TrainerConfig(strategy=strategy, precision="bf16-mixed", autocast="context", devices=2, extra=dict(QUIET))
    (advice,) = [w.message for w in cfg.warnings if w.field == "autocast"]
    plugin = _built(cfg).precision_plugin
    assert f'{type(plugin).__name__}("{plugin.precision}")' in advice and plugin.precision == "32-true", advice
    assert TrainerConfig(strategy=strategy, precision="bf16-mixed", autocast="plugin", devices=2).warnings == []


@pytest.mark.parametrize("strategy", ["deepspeed", "fsdp"])
def test_the_op_list_advice_names_the_plugin_the_trainer_gets(strategy: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    reset_backend()
    cfg = TrainerConfig(strategy=strategy, precision="bf16-mixed", lower_list=["linear"], devices=2,
                        extra=dict(QUIET))
    (advice,) = [w for w in cfg.warnings if "op lists are not used" in w.message]
    plugin = _built(cfg).precision_plugin
    assert advice.field == "strategy" and f"{type(plugin).__name__}, takes none" in advice.message, advice
    assert not hasattr(plugin, "op_lists") and "lower_list" not in cfg.code

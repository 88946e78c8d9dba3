"""Issue 22, part 1: every configuration rule has one owner, a validator returning issues in hpu_nb.core (release and
generation facts in hpu_nb.runtime.generations), used by the strategy / plugin constructors and by the config widget.

For each rule: a configuration that breaks it gives one Issue naming the field, one that keeps it gives none; the
constructors raise / warn with the validator's own message; the widget shows it under its own field name; and the
source tree defines each rule's message once.
"""

from __future__ import annotations

import ast
import importlib.util
import warnings
from pathlib import Path
from typing import Any

import pytest
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from hpu_nb.core.issues import Issue
from hpu_nb.core.precision_rules import fp8_quantize_issues, generation_issues
from hpu_nb.core.strategies.deepspeed import HPUDeepSpeedStrategy, deepspeed_issues
from hpu_nb.core.strategies.fsdp import HPUFSDPPrecision, HPUFSDPStrategy, fsdp_issues
from hpu_nb.notebook.trainer_config import TrainerConfig
from hpu_nb.runtime import get_backend, reset_backend
from hpu_nb.runtime.generations import GENERATIONS, Release, zero3_support

PACKAGE = Path(__file__).resolve().parents[2] / "hpu_nb"
TODAY = Release(1, 21)


class StubBackend:
    """Just the facts a validator asks a backend for."""

    def __init__(self, generation: str = "gaudi2", release: Release | None = TODAY, lazy: bool = False,
                 emulated: bool = False) -> None:
        self._generation = GENERATIONS[generation]
        self._release = release
        self._lazy = lazy
        self.is_emulated = emulated

    def generation(self) -> Any:
        return self._generation

    def release(self) -> Release | None:
        return self._release

    def is_lazy(self) -> bool:
        return self._lazy

    def fp16_support(self) -> tuple[bool, str]:
        return self._generation.fp16_support()

    def fp8_support(self) -> tuple[bool, str]:
        return self._generation.fp8_support()


def fields(issues: list[Issue]) -> list[tuple[str, str]]:
    return [(issue.field, issue.severity) for issue in issues]


# -- each rule: broken -> one issue naming the field; kept -> none ---------------------------------------------------
@pytest.mark.parametrize(
    ("broken", "kept", "expected"),
    [
        ({"stage": 4}, {"stage": 3}, ("stage", "error")),
        ({"stage": True}, {"stage": 0}, ("stage", "error")),
        ({"stage": 2, "offload_parameters": True}, {"stage": 3, "offload_parameters": True},
         ("offload_parameters", "error")),
        ({"stage": 3, "zero_optimization": False, "offload_parameters": True},
         {"stage": 3, "zero_optimization": True, "offload_parameters": True}, ("offload_parameters", "error")),
        ({"stage": 0, "offload_optimizer": True}, {"stage": 1, "offload_optimizer": True},
         ("offload_optimizer", "warning")),
        ({"stage": 3, "fp8_inference": True}, {"stage": 2, "fp8_inference": True}, ("stage", "error")),
        ({"stage": 3, "backend": StubBackend("gaudi2", Release(1, 18))},
         {"stage": 3, "backend": StubBackend("gaudi2", Release(1, 19))}, ("stage", "warning")),
        ({"stage": 3, "backend": StubBackend("gaudi2", None)},
         {"stage": 3, "backend": StubBackend("gaudi3", Release(1, 18))}, ("stage", "warning")),
    ],
)
def test_deepspeed_rules(broken: dict[str, Any], kept: dict[str, Any], expected: tuple[str, str]) -> None:
    assert fields(deepspeed_issues(**broken)) == [expected]
    assert deepspeed_issues(**kept) == []


def test_deepspeed_missing_is_one_issue(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    assert deepspeed_issues(check_installed=True) == []
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name, *a))
    (issue,) = deepspeed_issues(check_installed=True, precision="16-mixed")  # DeepSpeed's fp16 cannot be asked then
    assert issue.field == "deepspeed" and "pip install 'hpu_nb[deepspeed]'" in issue.message


def test_zero3_release_rule_is_the_release_s() -> None:
    gaudi2, gaudi3 = GENERATIONS["gaudi2"], GENERATIONS["gaudi3"]
    assert zero3_support(gaudi2, Release(1, 18)) == (False, "ZeRO-3 on Gaudi2 needs SynapseAI 1.19 or newer "
                                                            "(this is 1.18).")
    assert zero3_support(gaudi2, Release(1, 19)) == (True, "")
    assert zero3_support(gaudi2, Release(2, 0)) == (True, "")
    assert zero3_support(gaudi3, Release(1, 18)) == (True, "")
    assert zero3_support(gaudi2, None)[0] is False and "could not be told" in zero3_support(gaudi2, None)[1]


@pytest.mark.parametrize(
    ("broken", "kept", "expected"),
    [
        ({"backend": StubBackend(lazy=True)}, {"backend": StubBackend(lazy=False)}, ("strategy", "error")),
        ({"precision": "fp8"}, {"precision": "bf16-mixed"}, ("precision", "error")),
        ({"precision": "fp8-quantize"}, {"precision": "16-true"}, ("precision", "error")),
    ],
)
def test_fsdp_rules(broken: dict[str, Any], kept: dict[str, Any], expected: tuple[str, str]) -> None:
    assert fields(fsdp_issues(**broken)) == [expected]
    assert fsdp_issues(**kept) == []


def test_fsdp_eager_rule_says_which_gaudi() -> None:
    (emulated,) = fsdp_issues(backend=StubBackend(lazy=True, emulated=True))
    (gaudi,) = fsdp_issues(backend=StubBackend(lazy=True, emulated=False))
    assert "emulated Gaudi follows Gaudi's rule" in emulated.message and "this Gaudi is in lazy" in gaudi.message
    assert "fp8 is not available with the fsdp strategy" in fsdp_issues(precision="fp8")[0].message


@pytest.mark.parametrize("precision", ["16-mixed", "16-true", "fp8"])
def test_generation_rules(precision: str) -> None:
    (issue,) = generation_issues(precision, StubBackend("gaudi"))
    assert issue.field == "precision" and "it needs Gaudi2 or newer" in issue.message and "GAUDI" in issue.message
    assert generation_issues(precision, StubBackend("gaudi2")) == []
    assert generation_issues(precision, StubBackend("gaudi3")) == []
    assert generation_issues("bf16-mixed", StubBackend("gaudi")) == []


@pytest.mark.parametrize(("strategy", "devices"), [("ddp", 1), ("parallel", 1), ("fsdp", 1), ("single", 2),
                                                   ("deepspeed", 2), ("auto", 8)])
def test_fp8_quantize_runs_on_one_device(strategy: str, devices: int) -> None:
    assert fields(fp8_quantize_issues(strategy, devices)) == [("precision", "error")]


@pytest.mark.parametrize("strategy", ["auto", "single", "deepspeed"])
def test_fp8_quantize_on_one_device_is_kept(strategy: str) -> None:
    assert fp8_quantize_issues(strategy, 1) == []


# -- the constructors raise / warn with the validators' messages -----------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "rule"),
    [
        ({"stage": 4}, {"stage": 4}),
        ({"stage": 2, "offload_parameters": True}, {"stage": 2, "offload_parameters": True}),
        ({"config": {"zero_optimization": {"stage": 7}}}, {"stage": 7}),
        ({"config": {"zero_optimization": {"stage": 1, "offload_param": {"device": "cpu"}}}},
         {"stage": 1, "offload_parameters": True}),
    ],
)
def test_deepspeed_strategy_raises_the_rule_s_message(kwargs: dict[str, Any], rule: dict[str, Any]) -> None:
    (issue,) = deepspeed_issues(**rule)
    with pytest.raises(MisconfigurationException) as raised:
        HPUDeepSpeedStrategy(**kwargs)
    assert str(raised.value) == issue.message


def test_deepspeed_strategy_warns_the_release_rule_but_not_on_the_emulated_release(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 20 item 6: the emulated Gaudi (release 1.21) gets no ZeRO-3 warning; an old Gaudi2 release does."""
    monkeypatch.setenv("HPU_NB_DEVICE", "gaudi2")
    reset_backend()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            HPUDeepSpeedStrategy(stage=3)
        assert not [w for w in caught if "SynapseAI" in str(w.message)]
        monkeypatch.setattr(type(get_backend()), "release", lambda self: Release(1, 18))
        with pytest.warns(UserWarning, match=r"ZeRO-3 on Gaudi2 needs SynapseAI 1\.19 or newer \(this is 1\.18\)"):
            HPUDeepSpeedStrategy(stage=3)
    finally:
        monkeypatch.undo()
        reset_backend()


def test_fsdp_constructors_raise_the_rule_s_message(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError) as raised:
        HPUFSDPPrecision("fp8")
    assert str(raised.value) == fsdp_issues(precision="fp8")[0].message
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    reset_backend()
    try:
        with pytest.raises(MisconfigurationException) as refused:
            HPUFSDPStrategy()
        assert str(refused.value) == fsdp_issues(backend=get_backend())[0].message
    finally:
        monkeypatch.undo()
        reset_backend()


# -- the widget shows the same issues, under its own field names -------------------------------------------------------
def test_widget_shows_the_validators_issues() -> None:
    zero3 = TrainerConfig(strategy="deepspeed", deepspeed_stage=3, precision="fp8-measure", devices=2)
    (stage_issue,) = deepspeed_issues(stage=3, fp8_inference=True)
    assert [(i.field, i.message) for i in zero3.errors] == [("deepspeed_stage", stage_issue.message)]
    fsdp = TrainerConfig(strategy="fsdp", precision="fp8", devices=2)
    assert [(i.field, i.message) for i in fsdp.errors] == [("precision", fsdp_issues(precision="fp8")[0].message)]
    quantize = TrainerConfig(precision="fp8-quantize", strategy="parallel", devices=2)
    assert [(i.field, i.message) for i in quantize.errors] == [
        ("precision", fp8_quantize_issues("parallel", 2)[0].message)]
    assert TrainerConfig(strategy="deepspeed", deepspeed_stage=2, precision="fp8-measure", devices=2).errors == []


# -- each rule's message is defined once in the source tree -----------------------------------------------------------
RULE_TEXTS = (  # found inside one string literal of the package, no other
    "DeepSpeed ZeRO has stages 0, 1, 2 and 3",  # ZeRO stage
    "offload_parameters=True needs ZeRO stage 3",  # parameter offload
    "the optimizer stays on the device",  # optimizer offload at stage 0
    "ZeRO stage 3 partitions them",  # fp8 inference on ZeRO-3
    "needs SynapseAI 1.19",  # ZeRO-3 on Gaudi2: a release rule
    "DeepSpeed is not installed",
    "accelerator has no fp16",  # 16-mixed with a DeepSpeed accelerator without fp16
    "runs in eager mode only",  # FSDP
    "fp8 is not available with the fsdp strategy",
    "quantized fp8 inference runs on one device",
    "is not supported on {}: it needs {} or newer",  # fp16 / fp8: the generation table says which is first
    "the number of HPUs must be a whole number of at least 1",  # devices: the accelerator's
    "asks for {} HPUs but only {} are available",
)
LABELS = ("emulated Gaudi on the CPU", " (emulated)", "synDeviceGaudi2")  # string literals that are exactly these


def _string_literals(tree: ast.AST) -> list[str]:
    """The module's string literals (implicit concatenations joined, an f-string's text with {} for its fields),
    docstrings left out."""
    skip = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    skip |= {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    texts = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            texts.append(node.value)
        elif isinstance(node, ast.JoinedStr):
            texts.append("".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values))
    return texts


def test_string_literals_are_read_whole() -> None:
    tree = ast.parse('"""doc"""\nx = ("a b "\n     f"c {d} e")\ny = "f"\n')
    assert _string_literals(tree) == ["a b c {} e", "f"]


@pytest.fixture(scope="module")
def literals() -> dict[str, list[str]]:
    return {str(path.relative_to(PACKAGE.parent)): _string_literals(ast.parse(path.read_text(encoding="utf-8")))
            for path in sorted(PACKAGE.rglob("*.py"))}


@pytest.mark.parametrize("text", RULE_TEXTS)
def test_each_rule_is_defined_once(literals: dict[str, list[str]], text: str) -> None:
    places = [(path, literal) for path, found in literals.items() for literal in found if text in literal]
    assert len(places) == 1, places


@pytest.mark.parametrize("text", LABELS)
def test_each_label_is_written_once(literals: dict[str, list[str]], text: str) -> None:
    places = [path for path, found in literals.items() for literal in found if literal == text]
    assert len(places) == 1, places


# -- the widget only reads core's rules (issue 30, point 1) -----------------------------------------------------------
FORM_MODULES = sorted([PACKAGE / "notebook" / "config_widget.py",
                       *(PACKAGE / "notebook" / "trainer_config").glob("*.py")])


def _form_trees() -> dict[str, ast.AST]:
    return {path.name: ast.parse(path.read_text(encoding="utf-8")) for path in FORM_MODULES}


def _restated(tree: ast.AST) -> list[str]:
    """What a form module writes that is a rule of core's: a group of ZeRO stages, of precision names or of strategy
    choices (a tuple / list / set literal of two or more), a dtype, a Gaudi generation, the device count."""
    from hpu_nb.core.precision_names import PRECISION_ALIASES
    from hpu_nb.notebook.trainer_config import STRATEGIES

    precisions, strategies = set(PRECISION_ALIASES.values()), set(STRATEGIES)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}
    found = []
    for node in ast.walk(tree):
        if id(node) in docstrings:
            continue
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) >= 2 and all(
                isinstance(e, ast.Constant) for e in node.elts):
            values = [e.value for e in node.elts]
            if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
                found.append(f"stages {values}")
            elif all(v in precisions for v in values) or all(v in strategies for v in values):
                found.append(f"group {values}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if any(f"Gaudi{n}" in node.value or f"GAUDI{n}" in node.value for n in range(2, 10)):
                found.append(f"generation {node.value!r}")
            if any(f"torch.{dtype}" in node.value for dtype in ("bfloat16", "float16", "float32")):
                found.append(f"dtype {node.value!r}")
        elif isinstance(node, ast.Attribute) and node.attr in ("device_count", "fp16_support", "fp8_support"):
            found.append(f"asks the device: {node.attr}")
    return found


def test_the_form_restates_no_rule_of_core() -> None:
    restated = {name: found for name, tree in _form_trees().items() if (found := _restated(tree))}
    assert restated == {}, restated


def test_the_rule_detector_sees_a_restated_rule() -> None:
    for source in ('OFFLOAD = (1, 2, 3)', 'MIXED = ("bf16-mixed", "16-mixed")', 'if s in ("deepspeed", "fsdp"): pass',
                   'label = "16-mixed (fp16, Gaudi2+)"', 'dtype = "torch.bfloat16"', 'n = backend.device_count()'):
        assert _restated(ast.parse(source)), source


def test_the_widget_lists_no_field() -> None:
    """The form's fields are declared once, in TrainerConfig (with their controls); the widget names none of them."""
    fields_ = set(TrainerConfig.field_names())
    widget = _string_literals(ast.parse((PACKAGE / "notebook" / "config_widget.py").read_text(encoding="utf-8")))
    assert sorted(fields_ & set(widget)) == []


def test_the_form_follows_core_s_choice_of_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    """Op lists and the plugin in the code come from core's strategy -> precision plugin choice, not from the form:
    give DeepSpeed the plain HPU plugin and the form offers op lists with it and writes that plugin."""
    from hpu_nb.core.precision import HPUPrecisionPlugin
    from hpu_nb.core.selection import precision_plugin_class

    cfg = TrainerConfig(strategy="deepspeed", precision="bf16-mixed", lower_list=["linear"])
    assert precision_plugin_class(HPUDeepSpeedStrategy).__name__ == "HPUDeepSpeedPrecisionPlugin"
    assert not cfg.relevant("lower_list")
    monkeypatch.setattr(HPUDeepSpeedStrategy, "hpu_precision_plugin", HPUPrecisionPlugin)
    assert cfg.relevant("lower_list")
    assert 'HPUPrecisionPlugin(precision="bf16-mixed", lower_list=["linear"])' in cfg.code


def test_the_devices_rule_is_the_accelerator_s() -> None:
    from hpu_nb.core.accelerator import _parse_hpus, devices_issues

    backend = get_backend()
    for devices in (0, backend.device_count() + 1):
        (issue,) = devices_issues(devices, backend)
        assert [(i.field, i.message) for i in TrainerConfig(devices=devices).errors] == [("devices", issue.message)]
        with pytest.raises(MisconfigurationException) as raised:
            _parse_hpus(devices)
        assert str(raised.value) == issue.message
    assert devices_issues(1, backend) == []


# -- facts with one home (issue 30, point 1): fp8 ranges, memory counter names, the supported Lightning range -------
def _numbers(tree: ast.AST) -> list[float]:
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and isinstance(node.value, (int, float)) and not isinstance(node.value, bool)]


def test_the_fp8_ranges_are_written_once_in_the_generations() -> None:
    """240 / 448 / 57344 (the fp8 full scales) appear as numbers in runtime/generations.py only; the bridge's tables
    (quantizer, fused AdamW) take them from there."""
    ranges = {240, 448, 57344}  # 240.0 == 240: a float literal matches too
    found = {str(path.relative_to(PACKAGE.parent)) for path in sorted(PACKAGE.rglob("*.py"))
             if ranges & set(_numbers(ast.parse(path.read_text(encoding="utf-8"))))}
    found.discard("hpu_nb/notebook/memory_monitor.py")  # MAX_RANK_POINTS = 240 samples, not an fp8 range
    found.discard("hpu_nb/runtime/cache.py")  # PRIVATE_MODE = 0o700 (== 448), a folder mode, not an fp8 range
    assert found == {"hpu_nb/runtime/generations.py"}
    assert (GENERATIONS["gaudi2"].fp8_max("E4M3"), GENERATIONS["gaudi3"].fp8_max("E4M3")) == (240.0, 448.0)
    assert GENERATIONS["gaudi2"].fp8_max("E5M2") == GENERATIONS["gaudi3"].fp8_max("e5m2") == 57344.0
    with pytest.raises(ValueError, match="needs Gaudi2 or newer"):
        GENERATIONS["gaudi"].fp8_max("E4M3")
    with pytest.raises(ValueError, match="not a Gaudi fp8 format"):
        GENERATIONS["gaudi2"].fp8_max("E3M4")


def test_the_memory_counter_names_and_the_lightning_range_are_listed_once() -> None:
    import tomllib
    from packaging.requirements import Requirement

    from hpu_nb.core import registration

    def lists_the_counters(tree: ast.AST) -> bool:  # a tuple / list literal holding the counter names
        return any(isinstance(node, (ast.Tuple, ast.List)) and {"MaxAllocSize", "TotalSystemAllocs"} <= {
            e.value for e in node.elts if isinstance(e, ast.Constant)} for node in ast.walk(tree))

    counters = [path for path in sorted(PACKAGE.rglob("*.py"))
                if lists_the_counters(ast.parse(path.read_text(encoding="utf-8")))]
    assert [str(p.relative_to(PACKAGE.parent)) for p in counters] == ["hpu_nb/runtime/base.py"]
    pyproject = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8"))
    pinned = {str(Requirement(d).specifier) for d in pyproject["project"]["dependencies"]
              if Requirement(d).name == "lightning"}
    assert pinned == {registration.supported_lightning()} and registration.is_supported_lightning()
    assert not [path for path in sorted((PACKAGE / "core").rglob("*.py"))
                if "2, 6" in path.read_text(encoding="utf-8") or "2.6.x" in path.read_text(encoding="utf-8")]

"""TrainerConfig.code: every `extra` key and value is written as an exact Python literal or refused, never
interpolated as text (issue 28, item 2). Checked without running the code: it is parsed with `ast`, and each Trainer
argument's expression is evaluated alone with only the modules the code imports."""

from __future__ import annotations

import ast
import datetime
import importlib
import math
import pathlib

import pytest

from hpu_nb.notebook.trainer_config import TrainerConfig

HOSTILE_KEY = "max_epochs=__import__('os').system('touch /tmp/hpu_nb_pwned'), x"


def _trainer_arguments(code: str) -> dict[str, object]:
    """The Trainer call's keyword arguments in `code`, each evaluated on its own with the code's imports."""
    tree = ast.parse(code)
    namespace: dict[str, object] = {"__builtins__": {"float": float}}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                namespace[alias.asname or alias.name] = importlib.import_module(alias.name)
        elif isinstance(node, ast.ImportFrom):  # the logger's class
            for alias in node.names:
                namespace[alias.asname or alias.name] = getattr(importlib.import_module(node.module), alias.name)
    (call,) = [node.value for node in tree.body if isinstance(node, ast.Assign)
               and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "trainer"]
    assert isinstance(call, ast.Call)
    return {kw.arg: eval(compile(ast.Expression(kw.value), "<extra>", "eval"), namespace)
            for kw in call.keywords}


class _HostileStr(str):
    def __repr__(self) -> str:
        return "__import__('os').system('touch /tmp/hpu_nb_pwned')"


ROUND_TRIPS = {
    "newline": "line one\nline two",
    "carriage_return": "a\rb = 1",
    "nul": "a\x00b",
    "quotes_and_backslashes": "it's \"quoted\" \\n not a newline \\",
    "unicode": "naïve \u2028 separator",
    "inf": float("inf"),
    "minus_inf": float("-inf"),
    "big_int": 10**30,
    "small_float": 1e-300,
    "timedelta": datetime.timedelta(days=1, hours=2, microseconds=7),
    "zero_timedelta": datetime.timedelta(0),
    "negative_timedelta": datetime.timedelta(seconds=-1),
    "path": pathlib.Path("/tmp/with space/ckpt's"),
    "pure_path": pathlib.PurePosixPath("relative/dir"),
    "tuple": (1, "two", 3.0),
    "one_tuple": (1,),
    "empty_tuple": (),
    "nested": {"a": [1, (2, None)], "b": {"c": True}, 3: float("-inf")},
    "str_subclass": _HostileStr("plain"),
}


@pytest.mark.parametrize("name", list(ROUND_TRIPS))
def test_every_extra_value_round_trips_exactly_through_the_code(name):
    value = ROUND_TRIPS[name]
    cfg = TrainerConfig(extra={name: value})
    assert cfg.errors == []
    got = _trainer_arguments(cfg.code)[name]
    assert got == value and type(got) is (str if isinstance(value, str) else type(value))
    assert "pwned" not in cfg.code


def test_nan_round_trips_as_a_nan():
    cfg = TrainerConfig(extra={"gradient_clip_val": float("nan")})
    assert cfg.errors == []
    assert math.isnan(_trainer_arguments(cfg.code)["gradient_clip_val"])


def test_the_code_imports_what_timedelta_and_path_values_need():
    cfg = TrainerConfig(extra={"max_time": datetime.timedelta(hours=1), "default_root_dir": pathlib.Path("/tmp/x")})
    lines = cfg.code.splitlines()
    assert "import datetime" in lines and "import pathlib" in lines
    args = _trainer_arguments(cfg.code)
    assert args["max_time"] == datetime.timedelta(hours=1) and args["default_root_dir"] == pathlib.Path("/tmp/x")


@pytest.mark.parametrize("key", [HOSTILE_KEY, "class", "1st", "", "max epochs", 3, ("a",)],
                         ids=["hostile", "keyword", "digit", "empty", "space", "int", "tuple"])
def test_a_key_that_is_not_an_identifier_is_refused_and_never_written(key):
    cfg = TrainerConfig(extra={key: 1, "max_epochs": 2})
    errors = [i for i in cfg.errors if i.field == "extra"]
    assert len(errors) == 1 and "not a Trainer argument name" in errors[0].message
    code = cfg.code
    ast.parse(code)
    assert _trainer_arguments(code)["max_epochs"] == 2  # the rest of the configuration is still written
    written = "\n".join(line for line in code.splitlines() if not line.startswith("#"))
    if isinstance(key, str) and key:
        assert f"{key}=" not in written
    assert HOSTILE_KEY not in code  # the error comment quotes a key cut short
    assert "system" not in code and "__import__" not in written
    with pytest.raises(ValueError, match="not a Trainer argument name"):
        cfg.build()


@pytest.mark.parametrize("value", [object(), {1, 2}, 1 + 2j, b"bytes", [object()], {"k": object()}],
                         ids=["object", "set", "complex", "bytes", "list_of_object", "dict_of_object"])
def test_a_value_the_code_cannot_write_is_refused_naming_the_key(value):
    cfg = TrainerConfig(extra={"logger": value})
    (error,) = cfg.errors
    assert error.field == "extra" and "extra['logger']" in error.message
    assert "cannot be written as a Python literal" in error.message
    assert "logger" not in "".join(line for line in cfg.code.splitlines() if not line.startswith("#"))
    ast.parse(cfg.code)


def test_an_error_message_cannot_end_its_comment():
    """Errors are listed as comments on top of the code: a CR or NUL in a field's text must not end the comment."""
    cfg = TrainerConfig(precision="bogus\rimport os\x00", extra={"max_epochs": 1})
    assert cfg.errors
    tree = ast.parse(cfg.code)
    assert not any(isinstance(node, ast.Import) and node.names[0].name == "os" for node in tree.body)

"""Running a plan: the Trainer keyword arguments and the model its statements make (what `TrainerConfig.build()`
returns), by evaluating the same Calls and Refs the generated code shows."""

from __future__ import annotations

import importlib
from typing import Any

from hpu_nb.notebook.trainer_config.plan import FROM_LIGHTNING, HPU_NB_NAMES, Call, Plan, Ref


def resolve(func: str, namespace: dict[str, Any]) -> Any:
    """The object a dotted name of the plan stands for: a namespace variable, `L` (lightning) or an hpu_nb name."""
    head, *rest = func.split(".")
    if head in namespace:
        obj = namespace[head]
    elif head == "L":
        obj = importlib.import_module("lightning")
    elif head in FROM_LIGHTNING:
        obj = getattr(importlib.import_module(FROM_LIGHTNING[head]), head)
    elif head in HPU_NB_NAMES:
        obj = getattr(importlib.import_module("hpu_nb"), head)
    else:
        raise NameError(f"the plan uses an unknown name {head!r}")
    for attr in rest:
        obj = getattr(obj, attr)
    return obj


def evaluate(value: Any, namespace: dict[str, Any]) -> Any:
    if isinstance(value, Ref):
        return resolve(value.name, namespace)
    if isinstance(value, Call):
        args = [evaluate(a, namespace) for a in value.args]
        kwargs = {k: evaluate(v, namespace) for k, v in value.kwargs}
        return resolve(value.func, namespace)(*args, **kwargs)
    if isinstance(value, list):
        return [evaluate(v, namespace) for v in value]
    return value


def assign(namespace: dict[str, Any], target: str, value: Any) -> None:
    head, *rest = target.split(".")
    if not rest:
        namespace[head] = value
        return
    obj = namespace[head]
    for attr in rest[:-1]:
        obj = getattr(obj, attr)
    setattr(obj, rest[-1], value)


def run_plan(plan: Plan, model: Any) -> tuple[dict[str, Any], Any]:
    """(the last statement's keyword arguments, evaluated; `model` after the statements before it)."""
    namespace: dict[str, Any] = {"model": model}
    *prepare, last = plan
    for step in prepare:
        assign(namespace, step.target, evaluate(step.value, namespace))
    kwargs = {key: evaluate(value, namespace) for key, value in last.value.kwargs}
    return kwargs, namespace["model"]

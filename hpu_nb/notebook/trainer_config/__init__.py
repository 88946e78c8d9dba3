"""A Trainer configuration for HPU as plain data: validation, a plan of calls, `build()` and the equivalent `code`.

It lives in the notebook layer because what it builds includes notebook objects (MemoryMonitor). One job a module:
model.py (TrainerConfig: fields, relevance, issues, the plan they mean), form.py (each field's row in the form,
declared with the field), choices.py (the values and labels of each field), plan.py (Ref / Call / Statement: the
plan's vocabulary), render.py (the plan as Python), evaluate.py (the plan run: Trainer arguments and model),
op_list_field.py (the op-list fields' text). The names below are the public face.
"""

from __future__ import annotations

from hpu_nb.core.issues import Issue
from hpu_nb.notebook.trainer_config.choices import (
    AUTOCAST_LABELS,
    AUTOCAST_STYLES,
    FP8_INFERENCE,
    MIXED,
    PRECISIONS,
    SETS_ITSELF,
    STRATEGIES,
    StrategyChoice,
    plugin_precision,
    precision_label,
)
from hpu_nb.notebook.trainer_config.form import Control, control, form_fields
from hpu_nb.notebook.trainer_config.model import VALIDATOR_FIELDS, InvalidConfigError, TrainerConfig, config_from
from hpu_nb.notebook.trainer_config.op_list_field import OpList, op_list_text, parse_op_list
from hpu_nb.notebook.trainer_config.plan import HPU_NB_NAMES, IMPORTS, Call, Plan, Ref, Statement

__all__ = [
    "AUTOCAST_LABELS", "AUTOCAST_STYLES", "FP8_INFERENCE", "HPU_NB_NAMES", "IMPORTS", "MIXED", "PRECISIONS",
    "SETS_ITSELF", "STRATEGIES", "VALIDATOR_FIELDS", "Call", "Control", "InvalidConfigError", "Issue", "OpList", "Plan",
    "Ref", "Statement", "StrategyChoice", "TrainerConfig", "config_from", "control", "form_fields", "op_list_text",
    "parse_op_list", "plugin_precision", "precision_label",
]

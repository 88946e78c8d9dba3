"""A Trainer configuration for HPU as plain data: validation, a plan of calls, `build()` and the equivalent `code`.

It lives in the notebook layer because what it builds includes notebook objects (MemoryMonitor). One job a module:
model.py (TrainerConfig: fields, relevance, issues, the plan they mean), choices.py (the values and labels of each
field), plan.py (Ref / Call / Statement: the plan's vocabulary), render.py (the plan as Python), evaluate.py (the plan
run: Trainer arguments and model), op_list_field.py (the op-list fields' text). The names below are the public face.
"""

from __future__ import annotations

from hpu_nb.core.issues import Issue
from hpu_nb.notebook.trainer_config.choices import (
    ACCELERATORS,
    AUTOCAST_LABELS,
    AUTOCAST_STYLES,
    DEEPSPEED_STAGES,
    FP8,
    FP8_INFERENCE,
    MIXED,
    PRECISION_LABELS,
    PRECISIONS,
    SETS_ITSELF,
    STRATEGIES,
    STRATEGY_LABELS,
    STRING_STRATEGIES,
)
from hpu_nb.notebook.trainer_config.model import VALIDATOR_FIELDS, InvalidConfigError, TrainerConfig, config_from
from hpu_nb.notebook.trainer_config.op_list_field import OpList, op_list_text, parse_op_list
from hpu_nb.notebook.trainer_config.plan import HPU_NB_NAMES, IMPORTS, Call, Plan, Ref, Statement

__all__ = [
    "ACCELERATORS", "AUTOCAST_LABELS", "AUTOCAST_STYLES", "DEEPSPEED_STAGES", "FP8", "FP8_INFERENCE", "HPU_NB_NAMES",
    "IMPORTS", "MIXED", "PRECISIONS", "PRECISION_LABELS", "SETS_ITSELF", "STRATEGIES", "STRATEGY_LABELS",
    "STRING_STRATEGIES", "VALIDATOR_FIELDS", "Call", "InvalidConfigError", "Issue", "OpList", "Plan", "Ref",
    "Statement", "TrainerConfig", "config_from", "op_list_text", "parse_op_list",
]

"""The code of a plan: Python a user can paste that makes the same Trainer as `TrainerConfig.build()`, with the
configuration's errors on top as comments and the snippets (autocast in the LightningModule, ZeRO-Offload's
optimizer) a user pastes into their own class."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hpu_nb.core.issues import Issue
from hpu_nb.notebook.trainer_config.plan import HPU_NB_NAMES, IMPORTS, Call, Plan, Ref, required_names


def render_value(value: Any) -> str:
    """A plan value as Python source."""
    if isinstance(value, Ref):
        return value.name
    if isinstance(value, Call):
        parts = [render_value(a) for a in value.args] + [f"{k}={render_value(v)}" for k, v in value.kwargs]
        return f"{value.func}({', '.join(parts)})"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(render_value(v) for v in value) + "]"
    return repr(value)


def statement_lines(target: str, value: Any, width: int = 80) -> list[str]:
    """`target = value` on one line, or, when longer than `width`, one argument per line (as the Trainer call)."""
    line = f"{target} = {render_value(value)}"
    if len(line) <= width or not isinstance(value, Call):
        return [line]
    args = [render_value(a) for a in value.args] + [f"{k}={render_value(v)}" for k, v in value.kwargs]
    return [f"{target} = {value.func}("] + [f"    {a}," for a in args] + [")"]


def plan_code(plan: Plan, errors: Sequence[Issue] = (), snippets: Sequence[list[str]] = ()) -> str:
    """The plan as Python: errors (as comments), imports, snippets, the preparing statements, the Trainer call."""
    lines: list[str] = []
    if errors:
        lines += ["# This configuration has errors; fix them first:"]
        lines += [f"#   - {i.field}: " + i.message.replace("\n", "\n#     ") for i in errors]
        lines.append("")
    names = required_names(plan)
    lines += [IMPORTS[n] for n in names if n in IMPORTS]
    ours = [n for n in names if n in HPU_NB_NAMES]
    if ours:
        lines.append(f"from hpu_nb import {', '.join(ours)}")
    lines.append("")
    for snippet in snippets:
        if snippet:
            lines += snippet + [""]
    *prepare, last = plan
    for step in prepare:
        lines += [f"# {c}" for c in step.comments]
        if step.note:  # above the statement, not after it: the lines stay short enough for the panel
            lines.append(f"# {step.note}")
        lines += statement_lines(step.target, step.value)
    if prepare:
        lines.append("")
    lines.append(f"{last.target} = {last.value.func}(")
    lines += [f"    {key}={render_value(value)}," for key, value in last.value.kwargs]
    lines.append(")")
    return "\n".join(lines) + "\n"


def autocast_snippet(precision: str, style: str, device_type: str, backend_kind: str) -> list[str]:
    """Autocast written in the user's LightningModule (style "context" or "decorator"), as commented code lines."""
    dtype = "torch.bfloat16" if precision == "bf16-mixed" else "torch.float16"
    where = f"{backend_kind} autocasts on {device_type!r}"
    call = f'torch.autocast(device_type="{device_type}", dtype={dtype})'
    how = {"context": "a torch.autocast context", "decorator": "the @torch.autocast decorator"}[style]
    lines = [f"# {precision} with {how} in your LightningModule "
             f"({where}); the Trainer itself stays in 32-true:", "#", "#     import torch", "#",
             "#     class MyModel(L.LightningModule):"]
    if style == "context":
        lines += ["#         def forward(self, x):", f"#             with {call}:",
                  "#                 return self.net(x)"]
    else:
        lines += [f"#         @{call}", "#         def forward(self, x):", "#             return self.net(x)"]
    return lines


def offload_snippet(lr: float) -> list[str]:
    """ZeRO-Offload: the configure_optimizers to paste into the LightningModule (commented code lines)."""
    return ["# ZeRO-Offload steps the optimizer on the CPU with DeepSpeed's own optimizer",
            "# (it refuses a torch one): return it from your LightningModule's",
            "# configure_optimizers, with the learning rate you want:",
            "#", "#     from deepspeed.ops.adam import DeepSpeedCPUAdam", "#",
            "#     class MyModel(L.LightningModule):", "#         def configure_optimizers(self):",
            f"#             return DeepSpeedCPUAdam(self.parameters(), lr={lr:g})"]

"""Issue: one finding of a configuration rule, named by the field it concerns.

Each configuration rule is written once, as a validator returning issues, next to the piece that owns it
(`deepspeed_issues` in strategies/deepspeed_config.py, `fsdp_issues` in strategy_parts/fsdp.py, `precision_issues` in
precision_rules.py). The strategy and plugin constructors raise or warn with an issue's message; the config widget's
model (hpu_nb.notebook.trainer_config) shows the same issues next to its controls, and keeps no rule of its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = ["Issue", "Severity", "errors", "warnings"]

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Issue:
    """What is wrong (`message`) with which setting (`field`): an error refuses the configuration, a warning not."""

    field: str
    message: str
    severity: Severity = "error"

    @property
    def level(self) -> Severity:
        """The severity, by the name the config widget's front end uses."""
        return self.severity

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def __str__(self) -> str:
        return f"{self.severity}: {self.field}: {self.message}"


def errors(issues: Iterable[Issue]) -> list[Issue]:
    return [issue for issue in issues if issue.is_error]


def warnings(issues: Iterable[Issue]) -> list[Issue]:
    return [issue for issue in issues if not issue.is_error]

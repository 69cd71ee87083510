"""What the plan's rules found: refusals (each a `Problem` naming key, value and fix), warnings and notes. One
object the rule modules (validation, network_rules) append to, so `validate()` returns everything at once."""

from __future__ import annotations

from dataclasses import dataclass, field

from stacks.model.errors import Problem


@dataclass
class Validation:
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

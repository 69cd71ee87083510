"""Problems found in a stack config, reported all together before anything is created."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the config: where, what, why it would fail upstream, and what works."""

    key: str
    value: Any
    message: str
    upstream: str | None = None
    fix: str | None = None

    def render(self) -> str:
        lines = [f"vllm-cluster:{self.key} = {self.value!r}: {self.message}"]
        if self.upstream:
            lines.append(f"    upstream failure it prevents: {self.upstream}")
        if self.fix:
            lines.append(f"    what works: {self.fix}")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": f"vllm-cluster:{self.key}",
            "value": self.value,
            "message": self.message,
            "upstream": self.upstream,
            "fix": self.fix,
        }


class ConfigError(Exception):
    """Raised with every problem of a config at once; `str()` is the operator-facing report."""

    def __init__(self, stack: str, problems: list[Problem]) -> None:
        self.stack = stack
        self.problems = problems
        super().__init__(self.report())

    def report(self) -> str:
        head = f"stack {self.stack!r}: {len(self.problems)} config problem(s), nothing was created"
        return "\n".join([head, *(p.render() for p in self.problems)])

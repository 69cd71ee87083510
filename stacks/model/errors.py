"""Problems found in a stack config, reported all together before anything is created."""

from __future__ import annotations

import math
import re
import reprlib
from dataclasses import dataclass
from typing import Any

from stacks.model.masking import mask_secrets, masked, secret_name
from stacks.model.project import IN_CHECKOUT

MAX_VALUE_CHARS = 160
"""A value is shown in full up to this length: a pasted certificate or an alias bomb must not flood the report."""


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist = 3, 6, 6
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = MAX_VALUE_CHARS


def show_value(value: Any) -> str:
    """The value as the report prints it, cut to MAX_VALUE_CHARS without ever building the whole repr (an
    aliased value can be large). A credential in it is masked (stacks/model/masking.py)."""
    text = _REPR.repr(masked(value))
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS - 1] + "…"


_LONG_NUMBER = re.compile(r"\d{41,}")


def _short_numbers(text: str) -> str:
    """A number of hundreds of digits (a hostile value quoted in vLLM's message) cut to its first 20 and its
    length: the message stays one readable line."""
    return _LONG_NUMBER.sub(lambda m: f"{m.group(0)[:20]}…({len(m.group(0))} digits)", text)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the config: where, what, why it would fail upstream, and what works."""

    key: str
    value: Any
    message: str
    upstream: str | None = None
    fix: str | None = None
    where: str | None = None
    """`file:line:column` of the value, when it came from a stack file."""

    def render(self) -> str:
        if self.key.startswith("<") or ":" in self.key:  # the file, the command line or a raw file key
            shown = "" if self.value is None else f" {show_value(self.value)}"
            lines = [f"{self.key}{shown}: {self.message}"]
        else:
            value = "***" if secret_name(self.key.rsplit(".", 1)[-1]) and self.value is not None else \
                show_value(self.value)
            lines = [f"vllm-cluster:{self.key} = {value}: {self.message}"]
        if self.where:
            lines.append(f"    at: {self.where}")
        if self.upstream:
            lines.append(f"    upstream failure it prevents: {self.upstream}")
        if self.fix:
            lines.append(f"    what works: {self.fix}")
        return _short_numbers(mask_secrets("\n".join(lines)))

    def as_dict(self) -> dict[str, Any]:
        plain = isinstance(self.value, str | int | bool | type(None)) or (
            isinstance(self.value, float) and math.isfinite(self.value))
        value = masked(self.value) if plain else show_value(self.value)
        if secret_name(self.key.rsplit(".", 1)[-1]) and self.value is not None:
            value = "***"
        return {
            "key": f"vllm-cluster:{self.key}",
            "value": value,
            "message": mask_secrets(self.message),
            "upstream": self.upstream and _short_numbers(mask_secrets(self.upstream)),
            "fix": self.fix and mask_secrets(self.fix),
            "where": self.where,
        }


class ConfigError(Exception):
    """Raised with every problem of a config at once; `str()` is the operator-facing report."""

    def __init__(self, stack: str, problems: list[Problem]) -> None:
        self.stack = stack
        self.problems = problems
        super().__init__(self.report())

    def report(self) -> str:
        head = f"stack {self.stack!r}: {len(self.problems)} config problem(s), nothing was created"
        lines = [head, *(p.render() for p in self.problems)]
        secrets = [_assumable(p) for p in self.problems  # only a secret that is missing: --assume-secret fills it
                   if p.value is None and p.fix and "pulumi config set --secret" in p.fix]
        if secrets:
            any_name = "; team-a stands for any client name" if "proxy_keys.team-a" in secrets else ""
            lines.append("(to plan before the secrets exist, without the Pulumi CLI: "
                         + " ".join(f"--assume-secret {k}" for k in secrets)
                         + (f"; with make: SECRETS=\"{' '.join(secrets)}\"" if IN_CHECKOUT else "")  # the checkout's
                         + f"{any_name})")
        return "\n".join(lines)


def _assumable(problem: Problem) -> str:
    """The `--assume-secret` key for a missing secret: a client key by the client its fix names
    (api.proxy.check_client), else by an example name."""
    if problem.key != "proxy_keys":
        return problem.key
    named = re.search(r"proxy_keys\.([A-Za-z0-9_-]+)'", problem.fix or "")
    return f"proxy_keys.{named[1] if named else 'team-a'}"

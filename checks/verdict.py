"""The result every check prints: one human line with the evidence, or JSON, and a fixed exit code."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

EXIT = {"pass": 0, "fail": 1, "cannot-run": 2, "inconclusive": 2}
LOG_TIMEOUT_S = 120
"""`docker logs` of an engine container; the evidence checks' outer timeout is longer (components/check_commands)."""


@dataclass
class Verdict:
    check: str
    status: str
    summary: str
    evidence: list[str] = field(default_factory=list)
    next_step: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return EXIT[self.status]

    def line(self) -> str:
        text = f"{self.status.upper()} {self.check}: {self.summary}"
        if self.evidence:
            text += " | evidence: " + "; ".join(self.evidence)
        if self.next_step and self.status != "pass":
            text += f" | next step: {self.next_step}"
        return text


@dataclass
class Section:
    """One part of a multi-part check (preflight's gpu, hca, …)."""

    name: str
    ok: bool | None
    evidence: list[str]
    next_step: str | None = None


def combine(check: str, sections: list[Section]) -> Verdict:
    """Fail if any section failed, cannot-run if none failed but one did not run, else pass. The summary names
    every section by outcome (failed, not run with the reason, passed), so a short line hides nothing."""
    failed = [s for s in sections if s.ok is False]
    not_run = [s for s in sections if s.ok is None]
    passed = [s for s in sections if s.ok is True]
    details = {s.name: {"ok": s.ok, "evidence": s.evidence, "next_step": s.next_step} for s in sections}
    groups = [(failed, "failed", False), (not_run, "not run", True), (passed, "passed", False)]
    summary = "; ".join(f"{len(group)} {label}: " + ", ".join(f"{s.name} ({_reason(s)})" if why else s.name
                                                             for s in group)
                        for group, label, why in groups if group)
    shown = failed + not_run if failed else sections
    evidence = [f"{s.name}: {e}" for s in shown for e in s.evidence]
    steps = "; ".join(s.next_step for s in failed + not_run if s.next_step) or None
    if failed:
        return Verdict(check, "fail", summary, evidence, steps, details)
    if not_run:
        return Verdict(check, "cannot-run", summary, evidence, steps, details)
    return Verdict(check, "pass", f"all {len(sections)} section(s) passed: " + ", ".join(s.name for s in sections),
                   evidence, None, details)


def _reason(section: Section) -> str:
    text = section.evidence[0] if section.evidence else "no reason recorded"
    return text if len(text) <= 100 else text[:97] + "..."


def emit(verdict: Verdict, as_json: bool) -> int:
    if as_json:
        print(json.dumps(asdict(verdict) | {"exit_code": verdict.exit_code}, ensure_ascii=False))
    else:
        print(verdict.line())
    sys.stdout.flush()
    return verdict.exit_code


def read_log(container: str | None, log_file: str) -> str:
    """A container's `docker logs` (stdout and stderr), a log file, or stdin for '-'; OSError when unreadable."""
    if container:
        try:
            done = subprocess.run(["docker", "logs", container], capture_output=True, text=True,
                                  timeout=LOG_TIMEOUT_S)
        except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
            raise OSError(f"docker logs failed: {exc}") from exc
        return done.stdout + done.stderr
    if log_file == "-":
        return sys.stdin.read()
    with open(log_file, encoding="utf-8", errors="replace") as handle:
        return handle.read()

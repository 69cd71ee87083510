"""How long the API is down when `pulumi up` applies a plan diff: one pure function with today's rules.

`stacks.plan_diff.to_markdown` takes any `downtime_of(diff) -> str`; this is the default, so a computed
replacement matrix can replace it without touching the diff. Today's rules, from what the program does
(README "What `pulumi up` does"):

- an engine container replaced, created or deleted: the whole group goes (vLLM is fail-stop, the generation
  label moves every container, `delete_before_replace` frees the GPUs first), so the API is down from the
  delete until the new group is healthy: about the new plan's estimated load time (the
  `vllm-cluster.estimated-load-s` label: the slowest node's share of the weights at `model.load_gb_per_s`,
  plus start-up). New images are pulled before anything is deleted, so the pull is not downtime;
- only the proxy changes: its container is replaced, seconds of refused connections, the engines keep serving;
- otherwise (checks, warnings, notes): no downtime; checks re-run where their inputs changed.
"""

from __future__ import annotations

from typing import Any


def _duration(seconds: int) -> str:
    minutes, rest = divmod(seconds, 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def downtime_of(diff: dict[str, Any]) -> str:
    validation = diff.get("validation") or {}
    if not all((validation.get(side) or {}).get("valid") for side in ("base", "head")):
        return "unknown: a side of the change does not validate"
    containers = diff.get("containers") or {}
    engines = sorted(set(diff.get("replaced") or []) | set(containers))
    if engines:
        estimate = (diff.get("estimated_load_s") or {}).get("head")
        how_long = (f"about {_duration(int(estimate))} (the new plan's estimated load time, model.load_gb_per_s)"
                    if estimate else "until the new group is healthy (no load estimate in the plan)")
        return (f"the whole engine group ({len(engines)} container(s)) is down {how_long}: from the delete of the "
                "old containers until the new group answers /health; images are pulled before, while it serves")
    if diff.get("proxy"):
        return "seconds: the proxy container is replaced; the engines keep serving"
    return "none: no engine or proxy container is replaced (checks re-run where their inputs changed)"

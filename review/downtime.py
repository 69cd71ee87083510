"""How long the API is down when `pulumi up` applies a plan diff, by the rules of the replacement matrix.

`review.plan_diff.to_markdown` takes any `downtime_of(diff) -> str`; this is the default. It reads what
`diff_plans` worked out per engine container with `review.replacement` (the same provider rules the matrix
applies to the program's registered inputs): a container whose replacing inputs change is replaced, one whose
only change is its restart policy is updated in place (`docker update`), and the proxy is replaced when anything
it is built from changes. Then `review.replacement.downtime`: the whole engine group replaced costs the new plan's
modelled outage (`model.outage`, stacks/planner/outage.py: stop, load from page cache or disk, start-up, checks,
each figure with its source; `model.estimated_load_s` for a plan made by older code), the proxy alone seconds,
the rest nothing.

What a plan cannot show: secret values. `stacks diff` compares the encrypted values of the two stack files
instead (`diff["secrets"]`): a changed secret the engines read counts as the whole group replaced (matrix row
`api_key`), a changed proxy secret as the proxy replaced, assuming the value changed (re-encrypting the same value
changes the ciphertext and replaces nothing; the review says so).
"""

from __future__ import annotations

from typing import Any

from review.replacement import Downtime, downtime, duration


def assess(diff: dict[str, Any]) -> Downtime:
    validation = diff.get("validation") or {}
    if not all((validation.get(side) or {}).get("valid") for side in ("base", "head")):
        return Downtime("unknown", None, "unknown: a side of the change does not validate")
    containers = diff.get("containers") or {}
    moved = set(diff.get("replaced") or []) | {n for n, c in containers.items() if c.get("created") or c.get("deleted")}
    group = set(diff.get("engine_group") or []) or moved
    engines = ("replaced" if moved and moved >= group else "partial") if moved else (
        "updated" if diff.get("updated_in_place") else "")
    secrets = {s.get("replaces") for s in diff.get("secrets") or []}
    if "engine-group" in secrets and engines != "partial":
        engines = "replaced"
    proxy = "replaced" if diff.get("proxy_replaced", bool(diff.get("proxy"))) or "proxy" in secrets else ""
    outage = (diff.get("outage") or {}).get("head")
    estimate = outage["total_s"] if outage else (diff.get("estimated_load_s") or {}).get("head")
    return downtime(engines, proxy, estimate)


PHASE_NAMES = {"stop": "stop", "load-page-cache": "load from page cache", "load-disk": "load from disk",
               "start-up": "start-up", "checks": "checks"}


def phases_text(outage: dict[str, Any]) -> str:
    """`staged: stop 5 s + load from page cache 8 min 31 s + ...`: which restart, and its phases."""
    parts = " + ".join(f"{PHASE_NAMES.get(p['name'], p['name'])} {duration(int(p['seconds']))}"
                       for p in outage.get("phases") or [])
    how = ("staged: image, weights, dry run and page cache readied while the old group served"
           if outage.get("kind") == "staged" else "cold: every rank reads from disk")
    return f"{how}: {parts}"


def phase_lines(diff: dict[str, Any]) -> list[str]:
    """One line per phase of a group restart, with its figure and where the figure comes from."""
    outage = (diff.get("outage") or {}).get("head")
    if not outage or assess(diff).kind != "group":
        return []
    lines = [f"  - {PHASE_NAMES.get(p['name'], p['name'])}: {duration(int(p['seconds']))}, {p['figure']}. "
             f"Source: {p['source']}" for p in outage.get("phases") or []]
    faster = outage.get("faster")
    if isinstance(faster, dict) and isinstance(faster.get("total_s"), int) and faster["total_s"] < outage["total_s"]:
        lines.append(f"  - shorter with the multi-thread weight loader: {duration(faster['total_s'])} in all "
                     f"(instead of {duration(int(outage['total_s']))}); set {faster['how']}")
    return lines


def downtime_of(diff: dict[str, Any]) -> str:
    found = assess(diff)
    if found.kind == "group":
        containers = diff.get("containers") or {}
        # a renamed container is one deleted and one created: count what runs after the change
        count = len(set(diff.get("replaced") or []) | {n for n, c in containers.items() if c.get("created")}) or \
            len({n for n, c in containers.items() if c.get("deleted")}) or len(diff.get("engine_group") or [])
        text = found.text.replace("the whole engine group is", f"the whole engine group ({count} container(s)) is",
                                  1)
        outage = (diff.get("outage") or {}).get("head")
        return f"{text}. Phases ({phases_text(outage)})" if outage else text
    return found.text

"""How long the API is down when `pulumi up` applies a plan diff, by the rules of the replacement matrix.

`review.plan_diff.to_markdown` takes any `downtime_of(diff) -> str`; this is the default. It reads what
`diff_plans` worked out per engine container with `review.replacement` (the same provider rules the matrix
applies to the program's registered inputs): a container whose replacing inputs change is replaced, one whose
only change is its restart policy is updated in place (`docker update`), and the proxy is replaced when anything
it is built from changes. Then `review.replacement.downtime`: the whole engine group replaced costs about the new
plan's estimated load time (`model.estimated_load_s`; the `vllm-cluster.estimated-load-s` label of a base planned
by older code), the proxy alone seconds, the rest nothing.

What a plan cannot show: secret values. `stacks diff` compares the encrypted values of the two stack files
instead (`diff["secrets"]`): a changed secret the engines read counts as the whole group replaced (matrix row
`api_key`), a changed proxy secret as the proxy replaced, assuming the value changed (re-encrypting the same value
changes the ciphertext and replaces nothing; the review says so).
"""

from __future__ import annotations

from typing import Any

from review.replacement import Downtime, downtime


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
    return downtime(engines, proxy, (diff.get("estimated_load_s") or {}).get("head"))


def downtime_of(diff: dict[str, Any]) -> str:
    found = assess(diff)
    if found.kind == "group":
        containers = diff.get("containers") or {}
        # a renamed container is one deleted and one created: count what runs after the change
        count = len(set(diff.get("replaced") or []) | {n for n, c in containers.items() if c.get("created")}) or \
            len({n for n, c in containers.items() if c.get("deleted")}) or len(diff.get("engine_group") or [])
        return found.text.replace("the whole engine group is", f"the whole engine group ({count} container(s)) is",
                                  1)
    return found.text

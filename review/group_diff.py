"""`stacks diff` of a stack with replica groups (stacks/planner/groups.py): each group's plan diffed on its own
(review/plan_diff.py), and what the change costs the endpoint: nothing where the moved groups roll one at a time
behind the front door, each group's own restart where they cannot, one whole restart where the stack is split
into groups or joined back."""

from __future__ import annotations

from typing import Any

from review.downtime import assess, downtime_of, phases_text
from review.plan_diff import diff_plans, to_markdown
from review.replacement import duration

WHOLE = "(the one engine group)"


def grouped(plan: dict[str, Any] | None) -> bool:
    """Is this `plan --json` output a stack with groups (`{stack, rolling, groups}`)?"""
    return plan is not None and isinstance(plan.get("groups"), list) and "nodes" not in plan


def _plans(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    if grouped(plan):
        return {str(g["name"]): g["plan"] for g in plan["groups"]}
    return {WHOLE: plan}


def diff_stacks(stack: str, base_ref: str, base: dict[str, Any] | None, head: dict[str, Any] | None,
                base_errors: list[dict[str, Any]], head_errors: list[dict[str, Any]],
                secrets: dict[str, str]) -> dict[str, Any]:
    """The diff of two stack plans, at least one side with groups: per group (matched by name), the rolling
    verdict of the change's side and the downtime for the endpoint."""
    result: dict[str, Any] = {"stack": stack, "base": base_ref, "grouped": True,
                              "validation": {"base": {"valid": base is not None, "problems": base_errors},
                                             "head": {"valid": head is not None, "problems": head_errors}},
                              "rolling": (head or {}).get("rolling"), "groups": {}, "added": [], "removed": []}
    if base is None or head is None:
        result["downtime"] = "unknown: a side of the change does not validate"
        return result
    bases, heads = _plans(base), _plans(head)
    result["added"] = [g for g in heads if g not in bases]
    result["removed"] = [g for g in bases if g not in heads]
    for name in heads:
        if name in bases:
            result["groups"][name] = diff_plans(stack, base_ref, bases[name], heads[name], [], [], secrets)
    result["roles"] = {str(g["name"]): g.get("role", "replica") for g in head.get("groups", [])}
    result["router"] = _router_change(base.get("router"), head.get("router"))
    result["downtime"] = _downtime(result, base, head, heads)
    return result


def _router_change(base: dict[str, Any] | None, head: dict[str, Any] | None) -> str | None:
    """What the change does to the prefill/decode router (its container is replaced when its argv changes)."""
    if base is None and head is None:
        return None
    if base is None:
        return "added: the router starts after every group's turn"
    if head is None:
        return "removed"
    if base.get("argv") == head.get("argv"):
        return "unchanged (not restarted)"
    return ("replaced: its command line changes (a few seconds without the router: the endpoint answers 502 "
            "meanwhile)")


def _downtime(result: dict[str, Any], base: dict[str, Any], head: dict[str, Any],
              heads: dict[str, dict[str, Any]]) -> str:
    if grouped(base) != grouped(head) or result["added"] or result["removed"]:
        longest = max((h["model"]["outage"][h["model"]["outage"]["applies"]]["total_s"] for h in heads.values()),
                      default=0)
        how = ("split into replica groups" if grouped(head) and not grouped(base) else
               "joined back into one engine group" if grouped(base) and not grouped(head) else "regrouped")
        return (f"the stack is {how}: every engine container is replaced at once, the endpoint is down about "
                f"{duration(longest)} (the longest group's restart); later changes roll (see Rolling)"
                if (result.get("rolling") or {}).get("can_roll") else
                f"the stack is {how}: every engine container is replaced at once, the endpoint is down about "
                f"{duration(longest)}")
    moved = {name: d for name, d in result["groups"].items() if assess(d).kind not in ("none", "")}
    if not moved:
        return "none: no group's engines change"
    rolling = result.get("rolling") or {}
    each = "; ".join(f"group {name}: {downtime_of(d)}" for name, d in moved.items())
    if rolling.get("can_roll"):
        return (f"none expected for the endpoint: {len(moved)} group(s) change and roll one at a time behind the "
                f"front door, {rolling.get('capacity_during_change')} serving meanwhile. Each group's own "
                f"restart: {each}")
    roles = result.get("roles") or {}
    if any(r != "replica" for r in roles.values()):
        kept = [n for n in roles if n not in moved]
        return (f"only the changed group(s) restart: {each}" + (f"; unchanged: {', '.join(kept)}" if kept else "")
                + ". Requests need a group of each tier: while every group of a tier restarts, the endpoint "
                "answers errors (the router has no drain)")
    return f"the groups change one after another, each down for its own restart ({rolling.get('why')}): {each}"


def to_markdown_grouped(result: dict[str, Any]) -> str:
    kind = ("prefill/decode groups" if any(r != "replica" for r in (result.get("roles") or {}).values())
            else "replica groups")
    lines = [f"## `{result['stack']}`: plan at `{result['base']}` → working tree ({kind})", ""]
    for side, label in (("base", "base"), ("head", "this change")):
        v = result["validation"][side]
        lines.append(f"- **Validation ({label}):** " + ("valid" if v["valid"] else
                                                       f"INVALID, {len(v['problems'])} problem(s)"))
        lines += [f"  - `{p['key']}`: {p['message']}" for p in v["problems"]]
    lines.append(f"- **Downtime:** {result['downtime']}")
    if result.get("router"):
        lines.append(f"- **Router:** {result['router']}")
    rolling = result.get("rolling")
    if rolling:
        lines.append("- **Rolling:** " + (f"yes: {rolling['why']}" if rolling["can_roll"] else f"no: {rolling['why']}"))
    if result["added"] or result["removed"]:
        lines.append(f"- **Groups:** added {', '.join(result['added']) or '-'}; "
                     f"removed {', '.join(result['removed']) or '-'}")
    for name, d in result["groups"].items():
        outage = (d.get("outage") or {}).get("head")
        phases = f" ({phases_text(outage)})" if outage and assess(d).kind == "group" else ""
        role = (result.get("roles") or {}).get(name, "replica")
        tier = f" ({role} tier)" if role != "replica" else ""
        lines += ["", f"### group {name}{tier}{phases}", "", to_markdown(d).split("\n", 2)[-1].rstrip()]
    return "\n".join(lines) + "\n"

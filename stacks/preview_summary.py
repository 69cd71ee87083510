"""Condense `pulumi preview --json` into the Markdown a PR reviewer reads: what is replaced, updated, created
or deleted, by which changed keys, and how the stack's outputs (image, topology) move.

The input is Pulumi's preview digest: `{"config", "steps": [{"op", "urn", "oldState", "newState",
"diffReasons", "replaceReasons", "detailedDiff"}], "changeSummary", …}`. Values are never printed except
the stack outputs that carry no secret (`image`, `topology`, `endpoint`, `nodes`).
"""

from __future__ import annotations

import json
from typing import Any

ORDER = ("replace", "update", "create", "delete")
OP_GROUP = {"replace": "replace", "create-replacement": "replace", "delete-replaced": "replace",
            "update": "update", "create": "create", "delete": "delete", "read": "read", "same": "same",
            "refresh": "same", "discard": "delete", "import": "create", "import-replacement": "replace"}
PLAIN_OUTPUTS = ("image", "topology", "endpoint", "nodes", "served_model")
STACK_TYPE = "pulumi:pulumi:Stack"


def _name(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]


def _type(step: dict[str, Any]) -> str:
    state = step.get("newState") or step.get("oldState") or {}
    if state.get("type"):
        return str(state["type"])
    parts = step.get("urn", "").split("::")
    return parts[2].split("$")[-1] if len(parts) > 3 else "?"


def _keys(step: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(keys forcing replacement, other changed keys), from detailedDiff where the provider gives one."""
    detailed = step.get("detailedDiff") or {}
    reasons = list(step.get("replaceReasons") or [])
    if not detailed:
        return reasons, [p for p in step.get("diffReasons") or [] if p not in reasons]
    replace = [path for path, diff in detailed.items()
               if str(diff.get("kind") or diff.get("diffKind") or "").endswith("-replace")]
    # A top-level reason already shown by a detailed path (`triggers` by `triggers[0]`) is not repeated.
    replace += [r for r in reasons if not any(p == r or p.startswith((f"{r}[", f"{r}.")) for p in replace)]
    return replace, [p for p in detailed if p not in replace]


def summarize(preview: dict[str, Any]) -> dict[str, Any]:
    groups: dict[str, dict[str, dict[str, Any]]] = {op: {} for op in ORDER}
    outputs: dict[str, list[Any]] = {}
    same = 0
    for step in preview.get("steps") or []:
        op = OP_GROUP.get(str(step.get("op")), str(step.get("op")))
        urn = str(step.get("urn", ""))
        if _type(step) == STACK_TYPE:
            old = (step.get("oldState") or {}).get("outputs") or {}
            new = (step.get("newState") or {}).get("outputs") or {}
            outputs = {k: [old.get(k), new.get(k)] for k in PLAIN_OUTPUTS if old.get(k) != new.get(k)}
            continue
        if op == "same" or op == "read":
            same += 1
            continue
        if op not in groups:
            continue
        entry = groups[op].setdefault(urn, {"name": _name(urn), "type": _type(step), "replace_keys": [],
                                           "changed_keys": []})
        replace, other = _keys(step)
        if op == "update" and not replace and not other:
            groups[op].pop(urn)  # a component re-registering its outputs: nothing a reviewer can act on
            continue
        entry["replace_keys"] += [k for k in replace if k not in entry["replace_keys"]]
        entry["changed_keys"] += [k for k in other if k not in entry["changed_keys"]]
    counts = {op: len(groups[op]) for op in ORDER}
    return {"counts": counts, "unchanged": same, "outputs": outputs,
            "resources": {op: list(groups[op].values()) for op in ORDER},
            "change_summary": preview.get("changeSummary") or {}}


def _code(items: list[str]) -> str:
    return ", ".join(f"`{i}`" for i in items) or "–"


def to_markdown(summary: dict[str, Any]) -> str:
    counts = summary["counts"]
    head = ", ".join(f"{counts[op]} to {op}" for op in ORDER if counts[op]) or "no changes"
    lines = [f"## `pulumi preview`: {head} ({summary['unchanged']} unchanged)", ""]
    if summary["outputs"]:
        lines += ["### Stack outputs", ""]
        for key, (old, new) in summary["outputs"].items():
            if isinstance(old, dict) and isinstance(new, dict):
                moved = [f"{k}: {_short(old.get(k))} → {_short(new.get(k))}" for k in dict.fromkeys([*old, *new])
                         if old.get(k) != new.get(k)]
                lines.append(f"- `{key}`: " + "; ".join(moved))
            else:
                lines.append(f"- `{key}`: {_short(old)} → {_short(new)}")
        lines.append("")
    for op in ORDER:
        items = summary["resources"][op]
        if not items:
            continue
        lines += [f"### {op.capitalize()} ({len(items)})", ""]
        if op == "replace":
            lines += ["| resource | type | forces replacement | also changed |", "|---|---|---|---|"]
            lines += [f"| `{r['name']}` | `{r['type']}` | {_code(r['replace_keys'])} | {_code(r['changed_keys'])} |"
                      for r in items]
        elif op == "update":
            lines += ["| resource | type | changed |", "|---|---|---|"]
            lines += [f"| `{r['name']}` | `{r['type']}` | {_code(r['replace_keys'] + r['changed_keys'])} |"
                      for r in items]
        else:
            lines += [f"- `{r['name']}` (`{r['type']}`)" for r in items]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _short(value: Any) -> str:
    if value is None:
        return "–"
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return f"`{text}`"

"""Condense `pulumi preview` into the Markdown a PR reviewer reads: what is replaced, updated, created or deleted,
by which changed keys, how the stack's outputs (image, topology) move, and every error, warning and policy
violation, with an exit code that fails CI on errors and mandatory violations.

Inputs, as the Pulumi CLI writes them:

- the preview digest of `pulumi preview --json` (pkg/backend/display/json.go `ShowPreviewDigest`, types in
  `display.PreviewDigest`): `{config, steps: [{op, urn, provider, oldState, newState, diffReasons,
  replaceReasons, detailedDiff}], diagnostics: [{urn, message, severity}], duration, changeSummary,
  maybeCorrupt}`. The digest drops policy events (`case engine.PolicyViolationEvent: continue`), so a
  digest alone cannot show policy results, and the summary says so;
- the engine event stream, one `apitype.EngineEvent` per line (sdk/go/common/apitype/events.go): from
  `PULUMI_DEBUG_COMMANDS=true pulumi preview --json --event-log FILE` (the `--events FILE` beside a digest) or
  `PULUMI_ENABLE_STREAMING_JSON_PREVIEW=true pulumi preview --json` (alone). It carries `policyEvent`
  {resourceUrn, message, policyName, policyPackName, enforcementLevel} and `diagnosticEvent` {urn, prefix,
  message, severity, ephemeral}, and its `resourcePreEvent` metadata gives the steps.

Diagnostic severities are Pulumi's `diag.Severity`: debug, info, info#err, warning, error. Values are never
printed except the stack outputs that carry no secret (`image`, `topology`, `endpoint`, `nodes`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from review.replacement import CONTAINER
from stacks.planner.container_spec import GENERATION_LABEL, NODE_LABEL
from stacks.planner.router import ROUTER_RESOURCE

ORDER = ("replace", "update", "create", "delete")
OP_GROUP = {"replace": "replace", "create-replacement": "replace", "delete-replaced": "replace",
            "update": "update", "create": "create", "delete": "delete", "read": "read", "same": "same",
            "refresh": "same", "discard": "delete", "import": "create", "import-replacement": "replace"}
PLAIN_OUTPUTS = ("image", "topology", "endpoint", "nodes", "served_model")
STACK_TYPE = "pulumi:pulumi:Stack"
DIGEST_KEYS = ("config", "steps", "diagnostics", "duration", "changeSummary", "maybeCorrupt")
EVENT_KEYS = ("cancelEvent", "stdoutEvent", "diagnosticEvent", "preludeEvent", "summaryEvent", "resourcePreEvent",
              "resOutputsEvent", "resOpFailedEvent", "policyEvent", "policyRemediationEvent", "policyLoadEvent",
              "policyAnalyzeSummaryEvent", "policyRemediateSummaryEvent", "policyAnalyzeStackSummaryEvent",
              "startDebuggingEvent", "progressEvent", "errorEvent")
BLOCKING_LEVELS = ("mandatory",)
_COLOR_TAG = re.compile(r"<\{%[^%]*%\}>|\x1b\[[0-9;]*m")
"""Pulumi's colour directives (`<{%reset%}>`, kept raw in policy events) and ANSI escapes."""


class PreviewInputError(Exception):
    """The input is not what `pulumi preview` writes; the CLI exits 2 with this text."""


def _map(value: Any) -> dict[str, Any]:
    """A JSON object, or {} for anything else (a preview written by hand or by another tool)."""
    return value if isinstance(value, dict) else {}


# --- reading -----------------------------------------------------------------------------------------------


def _describe(data: Any) -> str:
    if isinstance(data, list):
        looks = (" (it looks like `pulumi stack history --json`)" if data and isinstance(data[0], dict)
                 and {"kind", "startTime"} <= set(data[0]) else "")
        return f"a JSON list of {len(data)} item(s){looks}"
    if isinstance(data, dict):
        if not data:
            return "an empty object `{}`"
        if "deployment" in data:
            return "a stack export (`pulumi stack export`)"
        return f"an object with keys {', '.join(sorted(data)[:8])}"
    return f"a JSON {type(data).__name__}"


def parse_digest(data: Any, name: str) -> dict[str, Any]:
    """A preview digest, checked: an object with `steps` (a list of {op, urn}) or a `changeSummary`."""
    if not isinstance(data, dict) or not ({"steps", "changeSummary"} & set(data)):
        raise PreviewInputError(
            f"{name} is not a `pulumi preview --json` digest: it is {_describe(data)}, and a digest has `steps` "
            "and `changeSummary` (display.PreviewDigest). Write one with `pulumi preview --json -s <stack> > "
            "preview.json`")
    steps = data.get("steps") or []
    if not isinstance(steps, list):
        raise PreviewInputError(f"{name}: `steps` is {type(steps).__name__}, not a list of steps")
    for index, step in enumerate(steps):
        if not isinstance(step, dict) or not isinstance(step.get("op"), str) or not isinstance(step.get("urn"), str):
            raise PreviewInputError(f"{name}: steps[{index}] has no `op` and `urn` strings; not a preview step")
        if step["op"] not in OP_GROUP:
            raise PreviewInputError(f"{name}: steps[{index}] has op {step['op'][:40]!r}, not a Pulumi step op "
                                    f"({', '.join(sorted(OP_GROUP))})")
        if not step["urn"].startswith("urn:pulumi:"):
            raise PreviewInputError(f"{name}: steps[{index}] has urn {step['urn'][:60]!r}, not a Pulumi URN")
        detailed = step.get("detailedDiff")
        if detailed is not None and not (isinstance(detailed, dict) and all(isinstance(v, dict)
                                                                            for v in detailed.values())):
            raise PreviewInputError(f"{name}: steps[{index}].detailedDiff is not a map of property diffs")
        for key in ("replaceReasons", "diffReasons"):
            if step.get(key) is not None and not (isinstance(step[key], list)
                                                  and all(isinstance(x, str) for x in step[key])):
                raise PreviewInputError(f"{name}: steps[{index}].{key} is not a list of property names")
        for key in ("oldState", "newState"):
            if step.get(key) is not None and not isinstance(step[key], dict):
                raise PreviewInputError(f"{name}: steps[{index}].{key} is not an object")
    for key, kind in (("diagnostics", list), ("changeSummary", dict)):
        if data.get(key) is not None and not isinstance(data[key], kind):
            raise PreviewInputError(f"{name}: `{key}` is {type(data[key]).__name__}, not a {kind.__name__}")
    if not steps and not data.get("changeSummary"):
        raise PreviewInputError(
            f"{name} has no steps and no changeSummary counts: a preview of this program always lists its "
            "resources (`same` included), so this is not its `pulumi preview --json` output; nothing can be "
            "summarised as 'no changes' from it")
    return data


def parse_events(text: str, name: str) -> list[dict[str, Any]]:
    """Engine events, one JSON object per line, each with one of apitype.EngineEvent's event keys."""
    events = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PreviewInputError(f"{name} line {number} is not JSON ({exc}); expected one engine event per "
                                    "line (`--event-log`, or streaming `pulumi preview --json`)") from None
        if not isinstance(event, dict) or not any(key in event for key in EVENT_KEYS):
            raise PreviewInputError(f"{name} line {number} is {_describe(event)}, not a Pulumi engine event "
                                    f"(one of {', '.join(EVENT_KEYS[:6])}, …)")
        events.append(event)
    if not events:
        raise PreviewInputError(f"{name} holds no engine events")
    summaries = [e["summaryEvent"] for e in events if isinstance(e.get("summaryEvent"), dict)]
    if summaries and summaries[-1].get("isPreview") is False:
        raise PreviewInputError(f"{name} is the event log of an update (`summaryEvent.isPreview` is false), not "
                                "of a preview: summarise `pulumi preview`")
    return events


def read_input(text: str, name: str) -> tuple[dict[str, Any], list[dict[str, Any]] | None]:
    """(digest, events or None): a digest, or an event stream turned into the digest it implies."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise PreviewInputError(f"{name} is JSON nested too deep to be a preview") from None
    except json.JSONDecodeError as exc:
        first = text.strip().splitlines()[:1]
        if first and _is_event_line(first[0]):
            events = parse_events(text, name)
            return digest_from_events(events), events
        raise PreviewInputError(f"{name} is not JSON ({exc}); expected `pulumi preview --json > FILE`") from None
    if isinstance(data, dict) and any(key in data for key in EVENT_KEYS) and "steps" not in data:
        events = parse_events(text, name)
        return digest_from_events(events), events
    return parse_digest(data, name), None


def _is_event_line(line: str) -> bool:
    try:
        item = json.loads(line)
    except json.JSONDecodeError:
        return False
    return isinstance(item, dict) and any(key in item for key in EVENT_KEYS)


def digest_from_events(events: list[dict[str, Any]]) -> dict[str, Any]:
    """What ShowPreviewDigest would have built: a step per resourcePreEvent, the summary's change counts."""
    steps = []
    for event in events:
        meta = (event.get("resourcePreEvent") or {}).get("metadata")
        if isinstance(meta, dict) and isinstance(meta.get("op"), str) and isinstance(meta.get("urn"), str):
            steps.append({"op": meta["op"], "urn": meta["urn"], "oldState": _map(meta.get("old")) or None,
                          "newState": _map(meta.get("new")) or None, "diffReasons": meta.get("diffs"),
                          "replaceReasons": meta.get("keys"), "detailedDiff": meta.get("detailedDiff")})
    summary: dict[str, Any] = next(
        (e["summaryEvent"] for e in reversed(events) if isinstance(e.get("summaryEvent"), dict)), {})
    return {"steps": steps, "changeSummary": summary.get("resourceChanges") or {},
            "maybeCorrupt": bool(summary.get("maybeCorrupt"))}


# --- findings: diagnostics and policy ----------------------------------------------------------------------


def _clean(text: Any, limit: int = 600) -> str:
    cleaned = _COLOR_TAG.sub("", str(text or "")).strip()
    lines = cleaned.splitlines()
    short = "\n".join(lines[:8]) + ("\n…" if len(lines) > 8 else "")
    return short if len(short) <= limit else short[:limit] + "…"


def _name(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]


def diagnostics(digest: dict[str, Any], events: list[dict[str, Any]] | None) -> list[dict[str, str]]:
    """Warnings and errors (not info, debug or ephemeral), each once: the digest's, then the events' others."""
    found: list[dict[str, str]] = []
    seen: set[tuple[str, str]] = set()
    raw = [d for d in digest.get("diagnostics") or [] if isinstance(d, dict)]
    raw += [e["diagnosticEvent"] for e in events or [] if isinstance(e.get("diagnosticEvent"), dict)
            and not e["diagnosticEvent"].get("ephemeral")]
    for item in raw:
        severity = str(item.get("severity") or "")
        if severity not in ("warning", "error"):
            continue
        message = _clean(f"{item.get('prefix') or ''}{item.get('message') or ''}")
        body = re.sub(r"^(error|warning): ", "", message)
        key = (str(item.get("urn") or ""), body)
        if key in seen:
            continue
        seen.add(key)
        found.append({"severity": severity, "resource": _name(key[0]) if key[0] else "", "message": body})
    return found


def policy_violations(events: list[dict[str, Any]] | None) -> list[dict[str, str]]:
    out = []
    for event in events or []:
        policy = event.get("policyEvent")
        if not isinstance(policy, dict):
            continue
        out.append({"level": str(policy.get("enforcementLevel") or "?"), "policy": str(policy.get("policyName") or "?"),
                    "pack": str(policy.get("policyPackName") or "?"),
                    "resource": _name(str(policy.get("resourceUrn") or "")) or "(stack)",
                    "message": re.sub(r"^(mandatory|advisory|warning): ", "", _clean(policy.get("message")))})
    return out


# --- the summary --------------------------------------------------------------------------------------------


def _type(step: dict[str, Any]) -> str:
    state = _map(step.get("newState")) or _map(step.get("oldState"))
    if state.get("type"):
        return str(state["type"])
    parts = step.get("urn", "").split("::")
    return parts[2].split("$")[-1] if len(parts) > 3 else "?"


def _keys(step: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(keys forcing replacement, other changed keys), from detailedDiff where the provider gives one."""
    detailed = {str(k): _map(v) for k, v in _map(step.get("detailedDiff")).items()}
    raw_reasons = step.get("replaceReasons")
    reasons = [str(r) for r in raw_reasons] if isinstance(raw_reasons, list) else []
    if not detailed:
        diffs = step.get("diffReasons")
        return reasons, [str(p) for p in diffs if str(p) not in reasons] if isinstance(diffs, list) else []
    replace = [path for path, diff in detailed.items()
               if str(diff.get("kind") or diff.get("diffKind") or "").endswith("-replace")]
    # A top-level reason already shown by a detailed path (`triggers` by `triggers[0]`) is not repeated.
    replace += [r for r in reasons if not any(p == r or p.startswith((f"{r}[", f"{r}.")) for p in replace)]
    return replace, [p for p in detailed if p not in replace]


def summarize(preview: dict[str, Any], events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    groups: dict[str, dict[str, dict[str, Any]]] = {op: {} for op in ORDER}
    outputs: dict[str, list[Any]] = {}
    same = 0
    for step in preview.get("steps") or []:
        op = OP_GROUP.get(str(step.get("op")), str(step.get("op")))
        urn = str(step.get("urn", ""))
        if _type(step) == STACK_TYPE:
            old = _map(_map(step.get("oldState")).get("outputs"))
            new = _map(_map(step.get("newState")).get("outputs"))
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
    found = diagnostics(preview, events)
    policy = policy_violations(events)
    blocking = ([f"error: {d['message']}" for d in found if d["severity"] == "error"]
                + [f"{p['level']} policy {p['policy']}: {p['message']}" for p in policy
                   if p["level"] in BLOCKING_LEVELS])
    if preview.get("maybeCorrupt"):
        blocking.append("Pulumi reports that one or more resources may be corrupt (maybeCorrupt)")
    return {"counts": counts, "unchanged": same, "outputs": outputs, "engine_groups": engine_groups(preview),
            "resources": {op: list(groups[op].values()) for op in ORDER},
            "change_summary": preview.get("changeSummary") or {},
            "diagnostics": found, "policy": policy, "policy_events_read": events is not None,
            "blocking": blocking, "ok": not blocking}


MOVES = ("replace", "create", "delete")


def _labels(step: dict[str, Any]) -> dict[str, str] | None:
    """A container step's labels; None when its state carries none readable (then it cannot be placed)."""
    state = _map(step.get("oldState")) or _map(step.get("newState"))
    inputs = state.get("inputs")
    raw = inputs.get("labels", []) if isinstance(inputs, dict) else None
    if isinstance(raw, dict):
        return {str(k): str(v) for k, v in raw.items() if isinstance(v, str)}
    if not isinstance(raw, list) or not all(isinstance(x, dict) for x in raw):
        return None
    return {str(x.get("label")): str(x.get("value")) for x in raw if isinstance(x.get("value"), str)}


def engine_groups(preview: dict[str, Any]) -> dict[str, Any] | None:
    """A stack with groups: which groups a preview restarts. The groups and their nodes are the ones the stack's
    last update exported (`groups` output); each engine container is placed by the node label it carries. A
    group restarts when its engines are replaced on every one of its nodes and none is kept, keeps running when none
    is replaced, and restarts in part (the fail-stop bug) otherwise; `unknown` when the preview replaces engines it
    cannot place (a node no exported group names), as then no group can be said to keep running. `pulumi preview
    --json` lists unchanged resources only with `--show-sames`, so a kept engine is seen only then. None for a stack
    of one engine group, or one never deployed with groups."""
    steps = [s for s in preview.get("steps") or [] if isinstance(s, dict)]
    stack = next((s for s in steps if _type(s) == STACK_TYPE), {})
    old_outputs = _map(_map(stack.get("oldState")).get("outputs"))
    exported = _map(old_outputs.get("groups"))
    if not exported:
        return None
    groups: dict[str, dict[str, Any]] = {}
    where: dict[str, str] = {}
    for name, g in exported.items():
        g = _map(g)
        raw_nodes = g.get("nodes")
        nodes = [n for n in raw_nodes if isinstance(n, str)] if isinstance(raw_nodes, list) else []
        role = g.get("role")
        groups[str(name)] = {"role": role if role in ("replica", "prefill", "decode") else "replica",
                             "nodes": nodes, "replaced": [], "replaced_on": [], "kept_on": []}
        where |= {n: str(name) for n in nodes}
    router: str | None = "unchanged" if old_outputs.get("router") else None
    unplaced: list[str] = []
    for step in steps:
        if _type(step) != CONTAINER:
            continue
        op = OP_GROUP.get(str(step.get("op")), str(step.get("op")))
        name = _name(str(step.get("urn", "")))
        labels = _labels(step)
        if labels is None:  # nothing to tell an engine by: never say a group keeps running past it
            if op in MOVES and name != ROUTER_RESOURCE and name not in unplaced:
                unplaced.append(name)
            continue
        if GENERATION_LABEL in labels:
            node = labels.get(NODE_LABEL, "")
            group = groups.get(where.get(node, ""))
            if group is None:
                if op in MOVES and name not in unplaced:
                    unplaced.append(name)
                continue
            if op in MOVES:
                group["replaced"] = sorted({*group["replaced"], name})
                group["replaced_on"] = sorted({*group["replaced_on"], node})
            elif op == "same":
                group["kept_on"] = sorted({*group["kept_on"], node})
        elif name == ROUTER_RESOURCE and op != "same":
            router = op
    for group in groups.values():
        if not group["nodes"] or (unplaced and not group["replaced"]):
            group["verdict"] = "unknown"
        elif not group["replaced"]:
            group["verdict"] = "keeps running"
        elif group["kept_on"] or set(group["replaced_on"]) != set(group["nodes"]):
            group["verdict"] = "partial"
        else:
            group["verdict"] = "restarts"
    return {"groups": groups, "router": router, "unplaced": unplaced}


def exit_code(summary: dict[str, Any]) -> int:
    """0 when nothing blocks, 1 on an error diagnostic, a mandatory violation or possible corruption."""
    return 0 if summary["ok"] else 1


def _code(items: list[str]) -> str:
    return ", ".join(f"`{i}`" for i in items) or "–"


def _one_line(text: str) -> str:
    """One table cell: newlines marked, pipes and angle brackets escaped (GitHub reads `<digest>` as HTML)."""
    return text.replace("\n", " ⏎ ").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def to_markdown(summary: dict[str, Any]) -> str:
    counts = summary["counts"]
    head = ", ".join(f"{counts[op]} to {op}" for op in ORDER if counts[op]) or "no resource changes"
    verdict = "" if summary["ok"] else f" — **BLOCKED** ({len(summary['blocking'])} blocking finding(s))"
    lines = [f"## `pulumi preview`: {head} ({summary['unchanged']} unchanged){verdict}", ""]
    lines += _findings(summary)
    lines += _groups(summary.get("engine_groups"))
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


def _groups(found: dict[str, Any] | None) -> list[str]:
    if not found:
        return []
    lines = ["### Engine groups", ""]
    for name, g in found["groups"].items():
        role = f" ({g['role']} tier)" if g["role"] != "replica" else ""
        if g["verdict"] == "keeps running":
            said = "keeps running (no engine container of it is replaced)"
        elif g["verdict"] == "restarts":
            said = f"**restarts**: {len(g['replaced'])} engine container(s) replaced, on {', '.join(g['nodes'])}"
        elif g["verdict"] == "unknown":
            said = ("unknown: the preview replaces containers this summary cannot place in a group (below)"
                    if g["nodes"] else "unknown: the stack's `groups` output names no node of it")
        else:
            kept = sorted(set(g["nodes"]) - set(g["replaced_on"]) | set(g["kept_on"]))
            said = (f"**PART OF THE GROUP RESTARTS**: engines replaced on {', '.join(g['replaced_on'])}, kept on "
                    f"{', '.join(kept)}; the rest hang against the new ones (vLLM is fail-stop)")
        lines.append(f"- group `{_one_line(name)}`{role}: {said}")
    if found.get("unplaced"):
        lines.append("- containers replaced that this summary cannot place in a group (no readable labels, or a node "
                     "no group of the last update names): " + _code([_one_line(n) for n in found["unplaced"]]))
    router = found.get("router")
    if router == "unchanged":
        lines.append("- router: keeps running")
    elif router == "update":
        lines.append("- router: updated in place (no restart)")
    elif router:
        lines.append(f"- router: **{router}** (a few seconds without the router: the endpoint answers 502 meanwhile)")
    return [*lines, ""]


def _findings(summary: dict[str, Any]) -> list[str]:
    errors = [d for d in summary["diagnostics"] if d["severity"] == "error"]
    warnings = [d for d in summary["diagnostics"] if d["severity"] == "warning"]
    mandatory = [p for p in summary["policy"] if p["level"] in BLOCKING_LEVELS]
    other = [p for p in summary["policy"] if p["level"] not in BLOCKING_LEVELS]
    lines = ["### Errors and policy", ""]
    if summary["policy_events_read"]:
        lines.append(f"- policy violations: {len(mandatory)} mandatory, {len(other)} advisory")
    else:
        lines.append("- policy violations: **not in this input**: `pulumi preview --json` leaves policy events out "
                     "(pkg/backend/display/json.go); pass `--events FILE` from `PULUMI_DEBUG_COMMANDS=true pulumi "
                     "preview --json --event-log FILE`")
    lines.append(f"- diagnostics: {len(errors)} error(s), {len(warnings)} warning(s)")
    if any(b.startswith("Pulumi reports") for b in summary["blocking"]):
        lines.append("- **Pulumi reports that one or more resources may be corrupt (maybeCorrupt)**")
    lines.append("")
    if errors or mandatory or other or warnings:
        lines += ["| level | what | resource | message |", "|---|---|---|---|"]
        lines += [f"| **error** | diagnostic | {_res(d['resource'])} | {_one_line(d['message'])} |" for d in errors]
        lines += [f"| **mandatory** | `{p['pack']}/{p['policy']}` | {_res(p['resource'])} | {_one_line(p['message'])} |"
                  for p in mandatory]
        lines += [f"| {p['level']} | `{p['pack']}/{p['policy']}` | {_res(p['resource'])} | {_one_line(p['message'])} |"
                  for p in other]
        lines += [f"| warning | diagnostic | {_res(d['resource'])} | {_one_line(d['message'])} |" for d in warnings]
        lines.append("")
    return lines


def _res(name: str) -> str:
    return f"`{name}`" if name else "–"


def _short(value: Any) -> str:
    if value is None:
        return "–"
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return f"`{text}`"

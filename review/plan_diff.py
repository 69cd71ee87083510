"""What a PR changes in a stack: two plans (base revision, working tree) compared, as Markdown or JSON.

Pure: takes the two plans' JSON forms (or a base that was invalid), returns a dict; `to_markdown` renders
it. Resource names follow the program (`engine-<node>-<container>`, `<node>-image`, `api-proxy`) so the
reviewer can match them with `pulumi preview`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from review.downtime import downtime_of as default_downtime_of
from review.downtime import phase_lines
from review.replacement import PROXY_PLAN_OUTSIDE_CONTAINER, SPEC_INPUTS, container_action
from stacks.planner.launch import ENGINE_REPLACE_ON_CHANGES
from stacks.planner.managed_options import NO_CARD

GENERATION = "vllm-cluster.generation"
LOAD_ESTIMATE = "vllm-cluster.estimated-load-s"
"""Where plans made by older code kept the load estimate (a container label); now `model.estimated_load_s`."""
SETTINGS = ("volumes", "devices", "ulimits", "shm_size_mb", "privileged", "ipc_mode", "restart", "healthcheck",
            "capabilities")
TOPOLOGY_KEYS = ("backend", "nodes", "tensor", "pipeline", "data", "expert", "gpus_used", "label")
MEMORY_KEYS = {
    "per_gpu_gb": "memory per GPU (GB: weights + KV of one full-length sequence + reserve)",
    "budget_gb": "usable per GPU (GB: memory x gpu_memory_utilization)",
    "left_gb": "left per GPU for the KV cache of more sequences (GB)",
    "weights_gb": "weights per GPU (GB)",
    "kv_one_sequence_gb": "KV of one full-length sequence per GPU (GB)",
    "engram": "Engram tables in",
    "host_pinned_gb_per_node": "pinned host RAM per node (GB, Engram tables)",
}
"""`summary.memory` fields a reviewer sees change (the figures hold for every node: one shard layout, sized for
the node with the smallest GPUs)."""
PROXY_SECRETS = ("tls_certificate", "tls_private_key", "proxy_keys.")


SWITCH = "(on)"


def _pairs(argv: list[str] | None) -> dict[str, str]:
    """`vllm serve` argv as flag -> value (`(on)` for a bare switch); the model path under `<model>`."""
    out: dict[str, str] = {}
    if not argv:
        return out
    items = list(argv)
    if items and not items[0].startswith("--"):
        out["<model>"] = items.pop(0)
    last: str | None = None
    for item in items:
        if item.startswith("--"):
            last = item
            out[item] = SWITCH
        elif last is not None and out[last] == SWITCH:
            out[last] = item
    return out


def _changes(old: dict[str, Any], new: dict[str, Any]) -> dict[str, list[Any]]:
    return {k: [old.get(k), new.get(k)] for k in list(dict.fromkeys([*old, *new])) if old.get(k) != new.get(k)}


def _containers(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"engine-{n['name']}-{c['name']}": c | {"node": n["name"], "role": n["role"]}
            for n in plan["nodes"] for c in n["containers"]}


def diff_plans(stack: str, base_ref: str, base: dict[str, Any] | None, head: dict[str, Any] | None,
               base_errors: list[dict[str, Any]] | None = None,
               head_errors: list[dict[str, Any]] | None = None,
               secret_changes: dict[str, str] | None = None) -> dict[str, Any]:
    """`base`/`head` are plan JSON dicts, or None with their errors when that side's config is invalid.
    `secret_changes`: secret config key -> changed / set / removed, from the encrypted values in the two stack
    files (review/git_base.py `secret_changes`; no plan holds a secret)."""
    result: dict[str, Any] = {
        "stack": stack, "base": base_ref,
        "validation": {
            "base": {"valid": base is not None, "problems": base_errors or [],
                     "warnings": (base or {}).get("warnings", [])},
            "head": {"valid": head is not None, "problems": head_errors or [],
                     "warnings": (head or {}).get("warnings", [])},
        },
        "topology": {}, "image": {}, "nodes": {"added": [], "removed": []}, "containers": {}, "replaced": [],
        "proxy": {}, "listeners": {"added": [], "removed": []}, "monitoring": {},
        "warnings": {"added": [], "removed": []}, "checks": {"added": [], "removed": []},
        "estimated_load_s": {"base": _load_estimate(base), "head": _load_estimate(head)},
        "outage": {"base": applied_outage(base), "head": applied_outage(head)},
        "memory": {}, "secrets": [], "firewall": {}, "endpoint": {},
    }
    if base is None or head is None:
        return result
    if bool(base.get("rehearsal")) != bool(head.get("rehearsal")):  # only then: a GPU stack's diff keeps its keys
        result["rehearsal"] = {"base": bool(base.get("rehearsal")), "head": bool(head.get("rehearsal"))}
    result["endpoint"] = _changes({"endpoint": base.get("endpoint")}, {"endpoint": head.get("endpoint")})
    result["memory"] = _memory(base, head)
    result["secrets"] = _secrets(secret_changes or {}, base, head)
    result["warnings"] = _added_removed(base.get("warnings", []), head.get("warnings", []))
    result["checks"] = _added_removed([c["name"] for c in base.get("checks", [])],
                                      [c["name"] for c in head.get("checks", [])])
    result["checks"]["changed"] = _changed_checks(base.get("checks", []), head.get("checks", []))
    result["topology"] = _changes({k: base["topology"].get(k) for k in TOPOLOGY_KEYS},
                                  {k: head["topology"].get(k) for k in TOPOLOGY_KEYS})
    result["image"] = _changes({k: base["image"].get(k) for k in ("repository", "tag", "digest")},
                               {k: head["image"].get(k) for k in ("repository", "tag", "digest")})
    base_nodes = {n["name"] for n in base["nodes"]}
    head_nodes = {n["name"] for n in head["nodes"]}
    result["nodes"] = {"added": sorted(head_nodes - base_nodes), "removed": sorted(base_nodes - head_nodes)}
    old_c, new_c = _containers(base), _containers(head)
    for name in dict.fromkeys([*new_c, *old_c]):
        old, new = old_c.get(name), new_c.get(name)
        if old is None or new is None:
            result["containers"][name] = {"created" if old is None else "deleted": True}
            continue
        change: dict[str, Any] = {}
        argv = _changes(_pairs(old.get("vllm_args")), _pairs(new.get("vllm_args")))
        if argv:
            change["argv"] = argv
        env = _changes(old["env"], new["env"])
        if env:
            change["env"] = env
        if old.get("command") != new.get("command") and not argv:
            change["command"] = True
        other: dict[str, Any] = {k: [old.get(k), new.get(k)] for k in SETTINGS if old.get(k) != new.get(k)}
        labels = _changes({k: v for k, v in old.get("labels", {}).items() if k != GENERATION},
                          {k: v for k, v in new.get("labels", {}).items() if k != GENERATION})
        if labels:
            other["labels"] = labels
        old_gen, new_gen = old.get("labels", {}).get(GENERATION), new.get("labels", {}).get(GENERATION)
        if not change and not other and old_gen != new_gen:  # only the generation moved: a restart_epoch bump
            other["labels"] = {GENERATION: [old_gen, new_gen]}
        if other:
            change["settings"] = other
        if change:
            result["containers"][name] = change
    image_changed = bool(result["image"])
    # Per container, the provider's rule for the docker inputs its changed spec fields feed (review/replacement.py):
    # the generation label moves with every replacing change, so one replaced container means all of them.
    result["engine_group"] = sorted(set(old_c) | set(new_c))
    actions = {n: _container_action(old_c[n], new_c[n], image_changed) for n in new_c if n in old_c}
    result["replaced"] = sorted(n for n, a in actions.items() if a == "replace")
    result["updated_in_place"] = sorted(n for n, a in actions.items() if a == "update")
    if image_changed:
        result["replaced_images"] = sorted(f"{n}-image" for n in head_nodes & base_nodes)
    result["proxy"] = _changes(base.get("proxy") or {}, head.get("proxy") or {}) if (
        base.get("proxy") != head.get("proxy")) else {}
    result["proxy_replaced"] = any(k not in PROXY_PLAN_OUTSIDE_CONTAINER for k in result["proxy"])
    result["monitoring"] = monitoring_changes(base.get("observability"), head.get("observability"))
    old_l = {_listener_key(x): x for x in base.get("listeners", [])}
    new_l = {_listener_key(x): x for x in head.get("listeners", [])}
    result["listeners"] = {"added": [new_l[k] for k in new_l if k not in old_l],
                           "removed": [old_l[k] for k in old_l if k not in new_l]}
    result["firewall"] = firewall_changes(base.get("firewall"), head.get("firewall"))
    return result


FIREWALL_RULES = (("internal_ports", "cluster_sources", "internal"), ("api_ports", "api_sources", "API"),
                  ("upstream_ports", "upstream_sources", "API behind the proxy"))
"""Per node in the plan's `firewall.nodes`: which ports admit which sources (stacks/planner/firewall.py)."""


def _firewall_rules(node: dict[str, Any] | None) -> list[str]:
    """One line per port (range) and the sources it admits; what a `drop` of the node's table spares."""
    if node is None:
        return []
    out = []
    for ports_key, sources_key, kind in FIREWALL_RULES:
        sources = ", ".join(node.get(sources_key) or [])
        who = node.get("upstream_who") if kind == "API behind the proxy" else None
        named = f" ({'; '.join(who)})" if who else ""
        out += [f"{kind} {port} only from {sources}{named}" for port in node.get(ports_key) or []]
    return out


def firewall_changes(base: dict[str, Any] | None, head: dict[str, Any] | None) -> dict[str, Any]:
    """Per node whose nftables table changes (its sha256, the firewall command's trigger): the port rules added
    and removed, with their sources. {} when no table changes."""
    old_fw, new_fw = base or {}, head or {}
    old = {n["node"]: n for n in old_fw.get("nodes") or []}
    new = {n["node"]: n for n in new_fw.get("nodes") or []}
    nodes: dict[str, Any] = {}
    for name in dict.fromkeys([*new, *old]):
        a, b = old.get(name), new.get(name)
        if (a or {}).get("sha256") == (b or {}).get("sha256"):
            continue
        before, after = _firewall_rules(a), _firewall_rules(b)
        nodes[name] = {"sha256": [(a or {}).get("sha256"), (b or {}).get("sha256")],
                       "added": [r for r in after if r not in before],
                       "removed": [r for r in before if r not in after]}
    out: dict[str, Any] = {}
    if bool(old_fw.get("enabled")) != bool(new_fw.get("enabled")):
        out["enabled"] = [old_fw.get("enabled"), new_fw.get("enabled")]
    if nodes:
        out["nodes"] = nodes
    return out


def _memory(base: dict[str, Any], head: dict[str, Any]) -> dict[str, Any]:
    """Changed memory figures ([base, head] each), with the node they were sized for; {} when none changed or a
    side has no memory summary (a base planned by code older than it)."""
    old = ((base.get("summary") or {}).get("memory")) or {}
    new = ((head.get("summary") or {}).get("memory")) or {}
    if not old or not new:
        return {"unknown": "the base plan has no memory summary"} if new else {}
    changes = {k: [old.get(k), new.get(k)] for k in MEMORY_KEYS if old.get(k) != new.get(k)}
    if changes:
        changes["node"] = [old.get("node"), new.get("node")]
    return changes


def _secrets(changes: dict[str, str], base: dict[str, Any], head: dict[str, Any]) -> list[dict[str, str]]:
    """Per changed secret, what `pulumi up` replaces when its value changed: a secret the engines read (their
    `secret_env`) replaces the group's secrets holder, and with it (its new ID in their label) every container; a proxy
    secret rewrites the proxy's files. Re-encrypting the same value changes the stack file but not the holder."""
    engine_refs = {ref for plan in (base, head) for n in plan["nodes"] for c in n["containers"]
                   for ref in (c.get("secret_env") or {}).values()}
    proxied = head.get("proxy") is not None or base.get("proxy") is not None
    out = []
    for key, change in sorted(changes.items()):
        if key in engine_refs:
            replaces = "engine-group"
        elif proxied and (key in PROXY_SECRETS or key.startswith(PROXY_SECRETS[-1])):
            replaces = "proxy"
        else:
            replaces = "none"
        out.append({"key": key, "change": change, "replaces": replaces})
    return out


_FILE_OWNER = (("prometheus.yml", "prometheus"), ("rules/", "prometheus"), ("alertmanager.yml", "alertmanager"),
               ("grafana/", "grafana"))


def _file_owner(path: str) -> str:
    """Which monitoring container a generated file is uploaded into (components/observability.py)."""
    if path.startswith("textfile/"):
        return f"{path.removeprefix('textfile/').removesuffix('.prom')}-node-exporter"
    return next(role for prefix, role in _FILE_OWNER if path.startswith(prefix))


def monitoring_changes(base: dict[str, Any] | None, head: dict[str, Any] | None) -> dict[str, Any]:
    """Monitoring containers created, deleted or replaced (an upload, argv or image changed), and the generated
    files that changed: none of them is an engine, so none restarts one."""
    if base == head:
        return {}
    old = {f"{c['node']}-{c['role']}": c for c in (base or {}).get("containers", [])}
    new = {f"{c['node']}-{c['role']}": c for c in (head or {}).get("containers", [])}
    old_files, new_files = (base or {}).get("files", {}), (head or {}).get("files", {})
    files = sorted(k for k in {*old_files, *new_files} if old_files.get(k) != new_files.get(k))
    owners = {_file_owner(f) for f in files}
    replaced = sorted(n for n in new if n in old and (
        old[n] != new[n] or n in owners or n.split("-", 1)[1] in owners))
    return {"created": sorted(set(new) - set(old)), "deleted": sorted(set(old) - set(new)), "replaced": replaced,
            "files": files}


def _container_action(old: dict[str, Any], new: dict[str, Any], image_changed: bool) -> str | None:
    """replace / update / None for one engine container, from the docker inputs its spec fields become."""
    inputs = {SPEC_INPUTS[k] for k in SPEC_INPUTS if old.get(k) != new.get(k)}
    if image_changed:
        inputs.add("image")  # the RemoteImage's new imageId
    found = container_action(inputs, ENGINE_REPLACE_ON_CHANGES)
    return found.kind if found else None


def _changed_checks(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Checks in both plans whose sections or what they prove differ: a weakened check (thinking or streaming
    off, another golden pattern) is a change a reviewer must see, though every process stays as it was."""
    before = {c.get("name"): c for c in old}
    changed = []
    for check in new:
        was = before.get(check.get("name"))
        if was is None:
            continue
        sections_then, sections_now = list(was.get("sections") or []), list(check.get("sections") or [])
        entry: dict[str, Any] = {"name": check.get("name"),
                                 "sections_removed": [x for x in sections_then if x not in sections_now],
                                 "sections_added": [x for x in sections_now if x not in sections_then]}
        if was.get("proves") != check.get("proves"):
            entry["proves"] = [was.get("proves"), check.get("proves")]
        if entry["sections_removed"] or entry["sections_added"] or "proves" in entry:
            changed.append(entry)
    return changed


def _added_removed(old: list[str], new: list[str]) -> dict[str, list[str]]:
    return {"added": [x for x in new if x not in old], "removed": [x for x in old if x not in new]}


def _load_estimate(plan: dict[str, Any] | None) -> int | None:
    """The slowest node's estimated load time: `model.estimated_load_s`, or the label older code put it in."""
    value = ((plan or {}).get("model") or {}).get("estimated_load_s")
    if isinstance(value, int):
        return value
    values = [int(c["labels"][LOAD_ESTIMATE]) for n in (plan or {}).get("nodes", []) for c in n["containers"]
              if str(c.get("labels", {}).get(LOAD_ESTIMATE, "")).isdigit()]
    return max(values) if values else None


def applied_outage(plan: dict[str, Any] | None) -> dict[str, Any] | None:
    """The group restart the program performs, phase by phase (`model.outage`, stacks/planner/outage.py); None
    for a plan made by older code."""
    outage = ((plan or {}).get("model") or {}).get("outage")
    if not isinstance(outage, dict) or not isinstance(outage.get(str(outage.get("applies"))), dict):
        return None
    applied = dict(outage[str(outage["applies"])])
    faster = outage.get("faster")
    if outage.get("applies") == "staged" and isinstance(faster, dict) and isinstance(faster.get("total_s"), int):
        applied["faster"] = {"total_s": faster["total_s"], "how": str(faster.get("how") or "")}
    return applied


def _listener_key(item: dict[str, Any]) -> str:
    return f"{_ports(item)} {item['bind']} {item['purpose']}"


def _ports(item: dict[str, Any]) -> str:
    end = item.get("port_end")
    return f"{item['node']}:{item['port']}" + (f"-{end}" if end else "")


def _one_line(text: str) -> str:
    """Control characters (newlines included) as spaces: nothing a value holds can start a Markdown line."""
    return re.sub(r"[\x00-\x1f\x7f]", " ", text)


def _text(text: str) -> str:
    """Free text in Markdown, on one line: GitHub would read `<digest>` as an HTML tag and hide it."""
    return _one_line(text).replace("<", "&lt;").replace(">", "&gt;")


def _code(value: Any) -> str:
    """Any value as one inline code span: whatever a stack file holds (a key with backticks, newlines or `<!--`)
    cannot end the span, start a line, or hide the rest of the review."""
    text = _one_line(str(value)).replace("`", "'")
    return f"`{text[:200] + '…' if len(text) > 200 else text}`"


def _v(value: Any) -> str:
    return "–" if value is None else _code(value)


def to_markdown(diff: dict[str, Any], downtime_of: Callable[[dict[str, Any]], str] = default_downtime_of) -> str:
    """The review comment; `downtime_of` says what the change costs in serving time (review/downtime.py)."""
    lines = [f"## {_code(diff['stack'])}: plan at {_code(diff['base'])} → working tree", ""]
    for side in ("base", "head"):
        v = diff["validation"][side]
        label = "base" if side == "base" else "this change"
        if v["valid"]:
            warn = f" ({len(v['warnings'])} warning(s))" if v["warnings"] else ""
            lines.append(f"- **Validation ({label}):** valid{warn}")
        else:
            lines.append(f"- **Validation ({label}):** INVALID, {len(v['problems'])} problem(s):")
            lines += [f"  - {_code(p['key'])} = {_v(p.get('value'))}: {_text(p['message'])}" for p in v["problems"]]
    # Said on every diff, not only when it appears: an image nobody has carded is never checked in silence.
    lines += [f"- **Image card:** {_text(w)}" for w in diff["validation"]["head"].get("warnings") or []
              if str(w).startswith(NO_CARD)]
    if not (diff["validation"]["base"]["valid"] and diff["validation"]["head"]["valid"]):
        return "\n".join(lines) + "\n"
    if diff.get("rehearsal"):  # docs/rehearsal.md: what deploys is, or stops being, a GPU-less rehearsal
        lines.append("- **Rehearsal:** " + (
            "this change makes the stack a rehearsal (rehearsal: true): no node has a GPU, the engine is a substitute "
            "for vLLM, and every GPU-only check prints NOT RUN" if diff["rehearsal"]["head"] else
            "this change ends the rehearsal (rehearsal: false): the nodes must have the GPUs, the engine is vLLM on "
            "them, and every GPU check runs"))
    lines.append(f"- **Downtime:** {downtime_of(diff)}")
    lines += phase_lines(diff)
    if diff.get("endpoint"):  # what clients call moves: every client and load balancer must follow
        before, after = diff["endpoint"]["endpoint"]
        lines.append(f"- **Clients:** the endpoint moves: {_code(before)} → {_code(after)}; every client, load "
                     "balancer and DNS name that calls the old one must change with it")
    estimate = diff.get("estimated_load_s") or {}
    if estimate.get("base") and estimate.get("head") and estimate["base"] != estimate["head"]:
        lines.append(f"- **Estimated load time:** {estimate['base']} s → {estimate['head']} s (what a group "
                     "replacement costs from now on; the policy pack's facts change, no engine)")
    warnings, checks = diff.get("warnings") or {}, diff.get("checks") or {}
    if warnings.get("added") or warnings.get("removed"):
        lines += ["", "### Warnings", ""]
        lines += [f"- added: {_text(w)}" for w in warnings.get("added", [])]
        lines += [f"- removed: ~~{_text(w)}~~" for w in warnings.get("removed", [])]
    if checks.get("added") or checks.get("removed") or checks.get("changed"):
        lines += ["", "### Checks", ""]
        lines += [f"- added {_code(c)}" for c in checks.get("added", [])]
        lines += [f"- **removed** {_code(c)} (it no longer runs)" for c in checks.get("removed", [])]
        for change in checks.get("changed", []):
            parts = []
            if change.get("sections_removed"):
                parts.append("**no longer checks** " + ", ".join(_code(x) for x in change["sections_removed"]))
            if change.get("sections_added"):
                parts.append("now also checks " + ", ".join(_code(x) for x in change["sections_added"]))
            if change.get("proves"):
                parts.append(f"proves {_text(str(change['proves'][1]))} (was: {_text(str(change['proves'][0]))})")
            lines.append(f"- changed {_code(change.get('name'))}: {'; '.join(parts)}")
    lines += _memory_lines(diff.get("memory") or {}) + _secret_lines(diff.get("secrets") or [])
    if not any([diff["topology"], diff["image"], diff["containers"], diff["nodes"]["added"],
                diff["nodes"]["removed"], diff["proxy"], diff["listeners"]["added"], diff["listeners"]["removed"],
                diff.get("replaced"), diff.get("updated_in_place"), diff.get("memory"), diff.get("secrets"),
                diff.get("monitoring"), diff.get("firewall")]):
        only_checks = any(checks.get(k) for k in ("added", "removed", "changed"))
        lines += ["", "No change to the engines, the proxy or the listeners; only the checks above change."
                  if only_checks else "No change to what gets deployed."]
        return "\n".join(lines) + "\n"
    if diff["topology"]:
        lines += ["", "### Topology", ""]
        lines += [f"- {k}: {_v(a)} → {_v(b)}" for k, (a, b) in diff["topology"].items()]
    if diff["image"]:
        lines += ["", "### Image", ""]
        lines += [f"- {k}: {_v(a)} → {_v(b)}" for k, (a, b) in diff["image"].items()]
    if diff["nodes"]["added"] or diff["nodes"]["removed"]:
        lines += ["", "### Nodes", ""]
        lines += [f"- added {_code(n)}" for n in diff["nodes"]["added"]] + [f"- removed {_code(n)}" for n in
                                                                       diff["nodes"]["removed"]]
    if diff["containers"]:
        lines += ["", "### Per node", ""]
        for name, change in diff["containers"].items():
            if change.get("created") or change.get("deleted"):
                lines.append(f"- {_code(name)}: {'created' if change.get('created') else 'deleted'}")
                continue
            lines.append(f"- {_code(name)}")
            for flag, (a, b) in change.get("argv", {}).items():
                lines.append(f"  - argv {_code(flag)}: {_v(a)} → {_v(b)}")
            for key, (a, b) in change.get("env", {}).items():
                lines.append(f"  - env {_code(key)}: {_v(a)} → {_v(b)}")
            if change.get("command"):
                lines.append("  - command (start script) changed")
            for key, value in change.get("settings", {}).items():
                if key == "labels":
                    lines += [f"  - label {_code(k)}: {_v(a)} → {_v(b)}" for k, (a, b) in value.items()]
                else:
                    lines.append(f"  - {key}: {_v(value[0])} → {_v(value[1])}")
    if diff["proxy"]:
        lines += ["", "### Proxy", ""]
        lines += [f"- {k}: {_v(a)} → {_v(b)}" for k, (a, b) in diff["proxy"].items()]
    monitoring = diff.get("monitoring") or {}
    if monitoring:
        lines += ["", "### Monitoring", "",
                  "Metrics pause while a monitoring container is replaced; no engine restarts for it:"]
        lines += [f"- {_code(n)}: {kind}" for kind in ("created", "deleted", "replaced") for n in monitoring[kind]]
        lines += [f"- generated file changed: {_code(f)}" for f in monitoring["files"]]
    if diff["listeners"]["added"] or diff["listeners"]["removed"]:
        lines += ["", "### Listening ports", ""]
        for tag, items in (("+", diff["listeners"]["added"]), ("-", diff["listeners"]["removed"])):
            lines += [f"- {tag} {_ports(x)} bind {x['bind']} ({x['network']}) {x['purpose']}"
                      + (" **PUBLIC**" if x["public"] else "") for x in items]
    lines += _firewall_lines(diff.get("firewall") or {})
    if diff["replaced"]:
        lines += ["", "### Replaced by `pulumi up`", "",
                  "The whole engine group, together (vLLM is fail-stop), after the new image is on every node and "
                  "its vLLM accepted every node's argv:"]
        lines += [f"- {_code(n)}" for n in diff["replaced"]]
        lines += [f"- {_code(n)} (pull)" for n in diff.get("replaced_images", [])]
    elif diff.get("updated_in_place"):
        lines += ["", "### Updated in place by `pulumi up`", "",
                  "Only the restart policy changes: `docker update`, no process restarts:"]
        lines += [f"- {_code(n)}" for n in diff["updated_in_place"]]
    return "\n".join(lines) + "\n"


def _firewall_lines(firewall: dict[str, Any]) -> list[str]:
    if not firewall:
        return []
    lines = ["", "### Host firewall", ""]
    if "enabled" in firewall:
        a, b = firewall["enabled"]
        lines.append(f"- firewall.enabled: {_v(a)} → {_v(b)}" + (
            " (**every port below loses its filter**)" if a and not b else ""))
    if firewall.get("nodes"):
        lines.append("Each node below gets its `table inet vllm_cluster` re-applied by its firewall command (one nft "
                     "transaction; no engine restarts for it). Per port, the only sources it admits new connections "
                     "from (+ added, − removed):")
    for node, change in (firewall.get("nodes") or {}).items():
        a, b = change["sha256"]
        lines.append(f"- {_code(node)}: table sha256 {_v(a and a[:12])} → {_v(b and b[:12])}")
        lines += [f"  - + {_text(r)}" for r in change["added"]]
        lines += [f"  - − ~~{_text(r)}~~" for r in change["removed"]]
    return lines


def _memory_lines(memory: dict[str, Any]) -> list[str]:
    if not memory:
        return []
    if "unknown" in memory:
        return ["", "### Memory", "", f"- not compared: {_text(str(memory['unknown']))}"]
    node = memory.get("node", [None, None])[1]
    lines = ["", "### Memory", "", f"Every node runs one shard layout; per-GPU figures are for {_code(node)} (the "
             "smallest GPUs), host RAM is per node:", ""]
    for key, label in MEMORY_KEYS.items():
        if key in memory:
            a, b = memory[key]
            lines.append(f"- {label}: {_v(a)} → {_v(b)}")
    return lines


def _secret_lines(secrets: list[dict[str, str]]) -> list[str]:
    if not secrets:
        return []
    what = {"engine-group": "**replaces the whole engine group** (it moves the group's replacement trigger; the "
                            "downtime above counts it)",
            "proxy": "replaces the proxy container (seconds)",
            "none": "replaces no engine or proxy container (the checks that use it re-run)"}
    lines = ["", "### Secrets", "", "Only the encrypted values in the stack file are compared, never the secrets:"]
    for s in secrets:
        lines.append(f"- {_code(s['key'])} {s['change']}: if its value changed, `pulumi up` {what[s['replaces']]}; "
                     "re-encrypting the same value replaces nothing")
    return lines

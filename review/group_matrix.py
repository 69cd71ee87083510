"""The replacement matrix of a stack with groups (replica groups, prefill/decode tiers): every key of the schema
changed alone, the real program run under Pulumi's mocks before and after (review/registrations.py), and for each
group whether its engines are replaced, updated in place or untouched, what happens to the router and the front
door, and what that costs the endpoint.

review/matrix.py answers the same question for a stack of one engine group, where any replaced engine takes the
whole group down. Here a replaced engine takes down its own group only, so the row says which: a decode-only
change must leave the prefill tier and the router running. A key of a list (`nodes[]`, `groups[]`) gets one row
per group its items belong to.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from review.config_mutations import BASE_SECRETS, Leaf, Mutation, canonical, leaves, mutate, stack_plan_of
from review.downtime import assess
from review.group_diff import diff_stacks
from review.matrix import RegisterError
from review.plan_diff import applied_outage
from review.replacement import (
    COMMAND_TYPES,
    CONTAINER,
    Registration,
    actions,
    duration,
    is_engine,
    is_monitoring,
    secrets_holders,
)
from stacks.planner.router import ROUTER_RESOURCE
from stacks.planner.stack_plan import StackPlan

Register = Callable[[str, dict[str, Any], dict[str, Any]], list[Registration]]

_STRENGTH = {"": 0, "updated": 1, "created": 2, "replaced": 3, "deleted": 4, "partial": 5}
_DONE = {"replace": "replaced", "create": "created", "delete": "deleted"}
_PLACE = re.compile(r"^(nodes|groups)\.([0-9]+)\.")


@dataclass
class GroupRow:
    stack: str
    key: str
    """the schema key; `nodes[] of <group>` / `groups[<group>]` where the change was made in one group's items"""
    change: str
    refused: str | None
    groups: dict[str, str] = field(default_factory=dict)
    """each group of the stack as it is -> `replaced`, `partial` (part of the group: a bug), `updated` (in place)
    or ''"""
    added: list[str] = field(default_factory=list)
    """groups the change creates (a group renamed is one replaced and one added)"""
    roles: dict[str, str] = field(default_factory=dict)
    router: str = ""
    """the router's container: `replaced`, `created`, `deleted`, `updated` or ''"""
    front_door: str = ""
    checks: list[str] = field(default_factory=list)
    checks_total: int = 0
    diff_groups: list[str] = field(default_factory=list)
    """the groups `stacks diff` says restart for the same change, from the two plans alone"""
    downtime: str = ""
    seconds: int | None = None


def front_door_secrets(values: Mapping[str, Any], secrets: dict[str, Any]) -> dict[str, Any]:
    """The secrets a stack with the front door on needs to plan (TLS material and the check client's key), set to
    stand-in values where the stack file leaves them to `pulumi config set --secret`."""
    api = values.get("api")
    proxy = api.get("proxy") if isinstance(api, Mapping) else None
    if not isinstance(proxy, Mapping) or proxy.get("enabled") is not True:
        return secrets  # a malformed section: the plan names it
    client = str(proxy.get("check_client") or "team-a")
    extra: dict[str, Any] = {"proxy_keys": {client: "matrix-client-key-0000"}}
    if proxy.get("tls", True):
        extra |= {"tls_certificate": "matrix-certificate", "tls_private_key": "matrix-key"}
    return {**extra, **secrets}


def engine_groups(whole: StackPlan) -> dict[str, str]:
    """Each engine container's resource name (components/vllm_engine.py: `engine-<group>-<node>-<container>`) ->
    its group."""
    return {f"engine-{g.name}-{node.name}-{spec.name}": str(g.name)
            for g in whole.groups for node in g.plan.nodes for spec in node.containers}


def _scope(mutation: Mutation, values: dict[str, Any]) -> str:
    """The group whose list item the mutation changed (a node's or a group's), '' for a stack-wide key."""
    found = _PLACE.match(mutation.change)
    if found is None:
        return ""
    index = int(found.group(2))
    if found.group(1) == "groups":
        return str(values["groups"][index]["name"])
    node = values["nodes"][index].get("name")
    return next((str(g["name"]) for g in values["groups"] if node in g.get("nodes", [])), "")


def _merge(a: str, b: str) -> str:
    return a if _STRENGTH[a] >= _STRENGTH[b] else b


@dataclass
class _Effect:
    groups: dict[str, str]
    router: str
    front_door: str
    checks: set[str]


def effect(base: list[Registration], after: list[Registration], names: dict[str, str]) -> _Effect:
    """What `pulumi up` does to each group's engines, the router and the front door, from the registrations."""
    olds, news = {r.name: r for r in base}, {r.name: r for r in after}
    holders = secrets_holders([*base, *after])
    members: dict[str, set[str]] = {}
    for name, group in names.items():
        members.setdefault(group, set()).add(name)
    moved: set[str] = set()
    updated: set[str] = set()
    out = _Effect({g: "" for g in members}, "", "", set())
    for name, act in actions(olds, news).items():
        reg = news.get(name) or olds[name]
        hard = act.kind in ("replace", "create", "delete")
        if is_engine(reg):
            (moved if hard else updated).add(name)
        elif reg.type == CONTAINER and name == ROUTER_RESOURCE:
            out.router = _merge(out.router, _DONE.get(act.kind, "updated"))
        elif reg.type == CONTAINER and not is_monitoring(reg):
            out.front_door = _merge(out.front_door, _DONE.get(act.kind, "updated"))
        elif reg.type in COMMAND_TYPES and name not in holders:
            out.checks.add(name)
    for group, engines in members.items():
        if moved & engines:
            out.groups[group] = "replaced" if engines <= moved else "partial"
        elif updated & engines:
            out.groups[group] = "updated"
    stray = (moved | updated) - set(names)
    if stray:  # an engine the plans do not name: never guess its group
        raise ValueError(f"engine containers of no planned group: {sorted(stray)}")
    return out


def _front(row: GroupRow) -> str:
    """What the change does to the router and the front door, as a clause ('' when neither restarts)."""
    parts = []
    if row.front_door == "deleted":
        parts.append("the front door is removed: clients lose the endpoint they use")
    elif row.front_door == "created":
        parts.append("a front door is added: a new endpoint for clients")
    elif row.front_door == "replaced":
        parts.append("the front door restarts (seconds of refused connections)")
    if row.router in ("replaced", "created"):
        parts.append(f"the router {'restarts' if row.router == 'replaced' else 'starts'} (the endpoint answers 502 "
                     "meanwhile)")
    elif row.router == "deleted":
        parts.append("the router is removed")
    return "; ".join(parts)


def verdict(row: GroupRow, whole: StackPlan, outages: dict[str, int]) -> tuple[str, int | None]:
    """What the row costs the endpoint, and the seconds where a group restart decides it. `whole`: the stack as the
    change leaves it (whether its groups can roll)."""
    partial = [g for g, s in row.groups.items() if s == "partial"]
    front = _front(row)
    tail = f"; {front}" if front else ""
    if partial:
        return (f"LONE-RANK RESTART: part of group {', '.join(partial)} is replaced; the rest hangs against it "
                "(vLLM is fail-stop)", None)
    replaced = [g for g, s in row.groups.items() if s == "replaced"]
    if replaced:
        longest = max(outages.get(g, 0) for g in [*replaced, *row.added]) or None
        about = f"about {duration(longest)}" if longest else "until healthy"
        kept = [g for g in row.groups if g not in replaced]
        keeps = f"; {', '.join(kept)} keep{'s' if len(kept) == 1 else ''} running" if kept else ""
        verb = "restarts" if len(replaced) == 1 else "restart"
        if any(r != "replica" for r in row.roles.values()):
            tiers = sorted({row.roles[g] for g in replaced})
            down = [t for t in tiers if all(s == "replaced" for g, s in row.groups.items() if row.roles[g] == t)]
            if down:
                return (f"the endpoint answers errors {about}: every {' and every '.join(down)} group restarts "
                        f"({', '.join(replaced)}){keeps}{tail}", longest)
            them = "it" if len(replaced) == 1 else "them"
            return (f"{', '.join(replaced)} {verb} ({about}): the requests the router sends to {them} fail "
                    f"meanwhile (the router has no drain); the other groups of each tier keep running{tail}", longest)
        if whole.rolling.can_roll and row.front_door != "deleted":
            capacity = whole.rolling.as_dict()["capacity_during_change"]
            return (f"none for the endpoint: {', '.join(replaced)} {'rolls' if len(replaced) == 1 else 'roll'} one "
                    f"at a time behind the front door, {capacity} serving meanwhile; each group {about}{tail}",
                    longest)
        return f"each of {', '.join(replaced)} down in turn, {about} ({whole.rolling.why}){tail}", longest
    if front:
        return f"seconds: {front}; every engine keeps running", 5
    return "none: no engine, router or front door restarts", 0


def _row(stack: str, label: str, base_regs: list[Registration], base_plan: StackPlan, base_json: dict[str, Any],
         mutations: list[Mutation], register: Register, refused: str | None) -> GroupRow:
    roles = {str(g.name): g.role for g in base_plan.groups}
    row = GroupRow(stack, label, "; ".join(m.change for m in mutations), refused, groups={g: "" for g in roles},
                   roles=roles)
    if refused is not None and not mutations:
        row.downtime = "refused alone"
        return row
    checks: set[str] = set()
    outages: dict[str, int] = {}
    diff_groups: set[str] = set()
    after_plan: StackPlan = base_plan
    for mutation in mutations:
        after_plan = mutation.plan
        try:
            registered = register(stack, mutation.values, mutation.secrets)
        except RegisterError as exc:
            row.refused, row.downtime = f"the program refuses it: {exc}", "refused alone"
            return row
        found = effect(base_regs, registered, engine_groups(base_plan) | engine_groups(after_plan))
        row.roles |= {str(g.name): g.role for g in after_plan.groups}
        for group, status in found.groups.items():
            if group in row.groups:
                row.groups[group] = _merge(row.groups[group], status)
            elif status and group not in row.added:
                row.added.append(group)
        row.router = _merge(row.router, found.router)
        row.front_door = _merge(row.front_door, found.front_door)
        checks |= found.checks
        after_json = after_plan.to_json_dict()
        for group in after_json["groups"]:
            applied = applied_outage(group["plan"])
            if applied is not None:
                outages[str(group["name"])] = max(outages.get(str(group["name"]), 0), int(applied["total_s"]))
        diff = diff_stacks(stack, "base", base_json, after_json, [], [], {})
        diff_groups |= {g for g, d in diff["groups"].items() if assess(d).kind in ("group", "lone-rank", "unknown")}
        diff_groups |= set(diff["removed"])  # a group renamed: the old one's engines go
    row.checks = sorted(checks)
    row.checks_total = sum(1 for r in base_regs if r.type in COMMAND_TYPES) - len(secrets_holders(base_regs))
    row.diff_groups = sorted(diff_groups)
    row.downtime, row.seconds = verdict(row, after_plan, outages)
    return row


def _label(leaf: Leaf, scope: str, mutations: list[Mutation]) -> str:
    label = leaf.key
    if scope and leaf.key.startswith("groups[]"):
        label = leaf.key.replace("groups[]", f"groups[{scope}]", 1)
    elif scope:
        label = f"{leaf.key} (a node of {scope})"
    if any("(to reach " in m.change for m in mutations):  # an unset section filled in: its defaults count too
        label += " (its section created)"
    return label


def group_rows(stack: str, values: dict[str, Any], register: Register, keys: list[Leaf] | None = None
               ) -> list[GroupRow]:
    """Every key of the schema changed alone in a stack with groups; list keys one row per group they touch."""
    values, own = canonical(values)
    secrets = front_door_secrets(values, dict(BASE_SECRETS) | own)
    base_plan = stack_plan_of(stack, values, secrets)
    if not base_plan.grouped:
        raise ValueError(f"{stack} has no groups: review/matrix.py covers it")
    base_regs = register(stack, values, secrets)
    rows: list[GroupRow] = []
    base_json = base_plan.to_json_dict()

    def changes_something(values: dict[str, Any], secrets: dict[str, Any], plan: StackPlan) -> bool:
        """A candidate whose plan and whose registered resources are the stack's own changes nothing: its row
        would say "none" of a value that is the same in effect (a default spelled out)."""
        if plan.to_json_dict() != base_json:
            return True
        try:
            return bool(actions({r.name: r for r in base_regs},
                                {r.name: r for r in register(stack, values, secrets)}))
        except RegisterError:
            return True  # the row says the program refuses it

    for leaf in keys if keys is not None else leaves():
        outcome = mutate(leaf, stack, values, secrets, [], planner=stack_plan_of, accept=changes_something)
        scoped: dict[str, list[Mutation]] = {}
        for mutation in outcome.mutations:
            scoped.setdefault(_scope(mutation, values), []).append(mutation)
        if not scoped:
            rows.append(_row(stack, leaf.key, base_regs, base_plan, base_json, [], register, outcome.refused))
        for scope, mutations in scoped.items():
            rows.append(_row(stack, _label(leaf, scope, mutations), base_regs, base_plan, base_json, mutations,
                             register, None))
    return rows


def group_row_dict(row: GroupRow) -> dict[str, Any]:
    return asdict(row)


_CELL = {"replaced": "**replaced**", "partial": "**PARTIAL**", "created": "created", "deleted": "**removed**",
         "updated": "updated in place", "": "–"}
"""A cell for every state `effect` gives an engine group, the router or the front door (_STRENGTH's keys)."""


def _cells(row: GroupRow) -> tuple[str, ...]:
    if row.refused is not None:
        return ("refused alone",) + ("",) * (len(row.groups) + 3)
    checks = ("all" if row.checks and len(row.checks) >= row.checks_total else
              f"{len(row.checks)} of {row.checks_total}" if row.checks else "–")
    added = f" (creates {', '.join(row.added)})" if row.added else ""
    return (*(_CELL[s] for s in row.groups.values()), _CELL[row.router], _CELL[row.front_door], checks,
            row.downtime + added)


def group_markdown(rows: list[GroupRow]) -> str:
    """One table per stack: keys with the same cells share a row."""
    out: list[str] = []
    for stack in dict.fromkeys(r.stack for r in rows):
        mine = [r for r in rows if r.stack == stack]
        groups = mine[0].groups
        heads = [f"group `{g}` ({mine[0].roles[g]})" for g in groups]
        shared: dict[tuple[str, ...], list[str]] = {}
        for row in mine:
            shared.setdefault(_cells(row), []).append(f"`{row.key}`")
        out += [f"**`{stack}`**", "",
                "| keys | " + " | ".join(heads) + " | router | front door | commands re-run | downtime |",
                "|---|" + "---|" * (len(heads) + 4)]
        out += [f"| {', '.join(keys)} | " + " | ".join(cells) + " |" for cells, keys in shared.items()]
        out.append("")
    return "\n".join(out)


def group_text(rows: list[GroupRow]) -> str:
    """Every row in full, for a terminal."""
    out = []
    for row in rows:
        if row.refused is not None:
            out.append(f"{row.stack} {row.key}: refused alone ({row.refused})")
            continue
        out.append(f"{row.stack} {row.key}: {row.change}")
        out += [f"    group {g} ({row.roles[g]}): {s or 'untouched'}" for g, s in row.groups.items()]
        out += [f"    group {g} ({row.roles[g]}): created" for g in row.added]
        out.append(f"    router: {row.router or 'untouched'}; front door: {row.front_door or 'untouched'}; "
                   f"{len(row.checks)} of {row.checks_total} commands re-run")
        out.append(f"    downtime: {row.downtime}")
    return "\n".join(out) + "\n"

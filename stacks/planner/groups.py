"""Replica groups: several vLLM instances in one stack, each on its own nodes, behind one front door.

A stack without `groups:` is one engine group: every rank of one DP/EP group, which vLLM runs fail-stop, so a
change replaces it whole and the endpoint is down meanwhile (stacks/planner/outage.py). With `groups:` each group is
planned exactly as a stack of its own nodes would be (its own topology, argv, checks, firewall) and the front door on
the stack's head (the first group's head) spreads requests over every group's API server. A change then rolls:
one group at a time is drained, replaced, checked and put back (stacks/planner/rolling.py), with N-1 of N groups
serving. The same concept is meant to carry prefill/decode tiers and several models later: a group with its
nodes, parallelism, role and model.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from dataclasses import dataclass
from typing import Any

from stacks.model.config import GroupConfig, StackConfig
from stacks.model.errors import Problem
from stacks.model.field_types import host_port
from stacks.model.kv_transfer_config import DisaggregationConfig
from stacks.planner.fabric import control_ip
from stacks.planner.kv_transfer import ROLES, kv_transfer_args
from stacks.planner.listeners import cluster_addresses, collapse

LOOPBACK = ("127.0.0.1", "::1", "localhost")


@dataclass(frozen=True)
class Peer:
    """Another group's API server, as the front door on the stack's head reaches it."""

    group: str
    host: str
    port: int


@dataclass(frozen=True)
class GroupContext:
    """What a group's plan needs to know about the others: its name and, for the group that holds the front door,
    the other groups' API servers."""

    name: str
    index: int
    peers: tuple[Peer, ...] = ()
    front_door: str | None = None
    """A later group behind the front door: the node whose nginx alone may reach this group's API server."""
    role: str = "replica"
    """replica, prefill or decode (`groups[].role`)."""
    kv_args: tuple[str, ...] = ()
    """A prefill/decode group: the `--kv-transfer-config` words every engine of it gets."""
    tier_sources: tuple[str, ...] = ()
    """A prefill/decode group: the other tier's node addresses, admitted to this group's internal ports (the NIXL
    handshake, UCX's transfers)."""
    disaggregation: DisaggregationConfig | None = None
    """A prefill/decode group: the stack's `disaggregation:` settings."""
    router: tuple[str, int] | None = None
    """The first group of a prefill/decode stack: the router (host, port) the front door sends every request to."""


@dataclass(frozen=True)
class Rolling:
    """Whether a change can replace one group at a time, and if not, why."""

    can_roll: bool
    why: str
    groups: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        n = len(self.groups)
        return {"can_roll": self.can_roll, "why": self.why, "groups": list(self.groups),
                "capacity_during_change": f"{n - 1} of {n} groups" if self.can_roll else "none"}


def group_problems(config: StackConfig) -> list[Problem]:
    """What is wrong with `groups:` itself (names, node membership, what groups do not support yet)."""
    groups = config.groups
    if not groups:
        return []
    problems: list[Problem] = []
    names = [n.name for n in config.nodes]
    if len(groups) == 1:
        problems.append(Problem("groups", [g.name for g in groups], "one group is the stack itself",
                                fix="remove groups:, or list two or more groups"))
    seen_groups: set[str] = set()
    owner: dict[str, str] = {}
    for i, group in enumerate(groups):
        if group.name in seen_groups:
            problems.append(Problem(f"groups.{i}.name", group.name, "another group has this name",
                                    fix="give every group its own name"))
        seen_groups.add(group.name)
        for j, node in enumerate(group.nodes):
            key = f"groups.{i}.nodes.{j}"
            if node not in names:
                problems.append(Problem(key, node, "no node of this name in nodes[]",
                                        fix=f"one of {', '.join(names)}"))
            elif node in owner:
                problems.append(Problem(key, node, f"node {node} is already in group {owner[node]}: a node serves "
                                        "one group", fix="list each node in exactly one group"))
            else:
                owner[node] = group.name
    missing = [n for n in names if n not in owner]
    if missing:
        problems.append(Problem("groups", [g.name for g in groups],
                                f"node(s) {', '.join(missing)} are in no group and would sit idle",
                                fix="add them to a group, or remove them from nodes[]"))
    if groups[0].nodes and groups[0].nodes[0] in names and groups[0].nodes[0] != names[0]:
        problems.append(Problem("groups.0.nodes.0", groups[0].nodes[0],
                                f"the first group's head must be the stack's head, {names[0]} (nodes[0]): the front "
                                "door runs there", fix=f"start groups[0].nodes with {names[0]}, or reorder nodes[]"))
    problems += _resource_name_problems(config)
    problems += _front_door_reach_problems(config)
    problems += _role_problems(config)
    if config.observability.enabled:
        problems.append(Problem("observability.enabled", True, "monitoring of a stack with groups is not built yet",
                                fix="observability.enabled: false, or remove groups:"))
    balancing: set[str] = set()
    for i, group in enumerate(groups):
        par = group.parallelism or config.parallelism
        where = f"groups.{i}.parallelism" if group.parallelism else "parallelism"
        if par.dp_load_balancing != "internal" and where not in balancing:  # the stack's: said once, not per group
            balancing.add(where)
            problems.append(Problem(f"{where}.dp_load_balancing", par.dp_load_balancing,
                                    "hybrid or external load balancing inside a group is not built yet",
                                    fix="internal (the front door spreads requests over the groups)"))
    return problems


def disaggregated(config: StackConfig) -> bool:
    """Prefill/decode groups: the front door sends every request to the router, which sends it to both tiers."""
    return any(g.role != "replica" for g in config.groups)


def _role_problems(config: StackConfig) -> list[Problem]:
    """Prefill/decode groups come in pairs of tiers, with `disaggregation:` and behind the front door; replica
    groups never have `disaggregation:`."""
    roles = [g.role for g in config.groups]
    if not disaggregated(config):
        if config.disaggregation is not None:
            return [Problem("disaggregation", "set", "no group has role prefill or decode, so nothing uses it",
                            fix="set groups[].role to prefill and decode, or remove disaggregation:")]
        return []
    problems = [Problem(f"groups.{i}.role", "replica", "a stack with prefill/decode groups sends every request "
                        "through the router to both tiers: a replica group would get none",
                        fix="role: prefill or role: decode")
                for i, role in enumerate(roles) if role == "replica"]
    for tier in ("prefill", "decode"):
        if tier not in roles:
            problems.append(Problem("groups", roles, f"no {tier} group: the router needs at least one of each tier",
                                    fix=f"set role: {tier} on at least one group"))
    if config.disaggregation is None:
        problems.append(Problem("disaggregation", None, "prefill/decode groups need the KV connector and router "
                                "settings", fix="disaggregation: {} (NixlConnector, vLLM's defaults; "
                                "docs/disaggregation.md)"))
    if not config.api.proxy.enabled:
        problems.append(Problem("api.proxy.enabled", False, "the router checks no client key (vllm-router 0.1.17 "
                                "has no flag for one): it listens on the head's loopback, behind the front door",
                                fix="api.proxy.enabled: true"))
    problems += _router_port_problems(config)
    for name in config.container.env:
        if name.startswith(("VLLM_NIXL_", "UCX_")):
            problems.append(Problem(f"container.env.{name}", config.container.env[name], "is set by the plan on "
                                    "every prefill/decode engine (the side channel and UCX devices, per node)",
                                    fix="disaggregation.side_channel_port / side_channel_network; a UCX_* setting "
                                        "in fabric.env"))
    return problems


def _router_port_problems(config: StackConfig) -> list[Problem]:
    """The router's two loopback ports on the head must be free there: sshd, vLLM's own API port and the front
    door hold theirs on every address."""
    if config.disaggregation is None:
        return []
    router, head = config.disaggregation.router, config.head
    taken = {22: "sshd", head.ssh.port: "sshd (nodes[0].ssh.port)", config.serving.port: "vLLM's API (serving.port)",
             config.api.proxy.port: "the front door (api.proxy.port)"}
    problems = []
    for key, port in (("port", router.port), ("metrics_port", router.metrics_port)):
        if port in taken:
            problems.append(Problem(f"disaggregation.router.{key}", port, f"{taken[port]} listens on {port} on "
                                    f"{head.name}, where the router runs", fix="another port, e.g. 8090 or 29000"))
    if router.port == router.metrics_port:
        problems.append(Problem("disaggregation.router.metrics_port", router.metrics_port, "is the router's own "
                                "port (disaggregation.router.port)", fix="two different ports, e.g. 8090 and 29000"))
    return problems


def tier_urls(config: StackConfig) -> dict[str, list[str]]:
    """Every prefill and decode group's API server, as the router on the stack's head reaches it: the first
    group's on loopback (it binds serving.host on the head), the others' on their heads' control-plane addresses."""
    urls: dict[str, list[str]] = {"prefill": [], "decode": []}
    peers = {p.group: p for p in front_door_peers(config)}
    for i, group in enumerate(config.groups):
        if group.role == "replica":
            continue
        if i == 0:
            host = config.serving.host if config.serving.host not in ("localhost", "0.0.0.0", "::") else "127.0.0.1"
            urls[group.role].append(f"http://{host_port(host, config.serving.port)}")
        else:
            urls[group.role].append(f"http://{host_port(peers[group.name].host, peers[group.name].port)}")
    return urls


def _resource_name_problems(config: StackConfig) -> list[Problem]:
    """A group's engine resources are named `engine-<group>-<node>-…` (components/program.py), and when a stack is
    split into groups each is aliased to its old name `engine-<node>-…`. Group a on node b-x and group a-b on node x
    would both be `engine-a-b-x-…` (Pulumi stops at the duplicate after the plan passed), and group a on node x
    would take the old name of node a-x's engine (the split would move that node's container). Both are refused."""
    nodes = {n.name for n in config.nodes}
    spelled: dict[str, tuple[str, str]] = {}
    problems: list[Problem] = []
    for i, group in enumerate(config.groups):
        for node in group.nodes:
            joined = f"{group.name}-{node}"
            if joined in spelled and spelled[joined][0] != group.name:
                other, other_node = spelled[joined]
                problems.append(Problem(
                    f"groups.{i}.name", group.name, f"group {group.name} on node {node} and group {other} on node "
                    f"{other_node} would both name their engine engine-{joined}-…: Pulumi refuses a second "
                    "resource of one name", fix="a group name that is not another group's name and a '-'"))
            elif joined in nodes:
                problems.append(Problem(
                    f"groups.{i}.name", group.name, f"group {group.name} on node {node} names its engine "
                    f"engine-{joined}-…, the name node {joined}'s engine had before the stack was split into groups "
                    "(its alias): the split would move that node's container", fix="a group name that is not the "
                    "start of a node name followed by '-'"))
            spelled.setdefault(joined, (group.name, node))
    return problems


def _front_door_reach_problems(config: StackConfig) -> list[Problem]:
    """The front door connects to a later group's API server from its host's control-plane address, the only one
    that group's firewall admits (`group_config`): the two must be of one address family, or nginx never reaches
    the group."""
    if not config.api.proxy.enabled or config.serving.host not in LOOPBACK:
        return []
    source = ipaddress.ip_network(front_door_source(config))
    by_name = {n.name: n for n in config.nodes}
    problems = []
    for i in range(1, len(config.groups)):
        head = by_name.get(config.groups[i].nodes[0])
        if head is None:  # not a node: said above
            continue
        target = ipaddress.ip_address(control_ip(config, head) or head.management_ip)
        if target.version != source.version:
            problems.append(Problem(
                f"groups.{i}.nodes.0", head.name, f"group {config.groups[i].name}'s API server binds {target} "
                f"(IPv{target.version}), but the front door on {config.head.name} connects from "
                f"{source.network_address} (IPv{source.version}), the only address its firewall admits",
                fix=f"control-plane addresses (fabric.control_plane: {config.fabric.control_plane}) of one address "
                    "family on every group's head and the stack's head"))
    return problems


def group_config(config: StackConfig, index: int) -> StackConfig:
    """The config of group `index` as a stack of its own: its nodes in its order, its parallelism, no groups. Only
    the first group keeps the front door; another group's vLLM binds its head's control-plane address where the
    stack's binds loopback behind the front door, so that the front door can reach it."""
    group = config.groups[index]
    by_name = {n.name: n for n in config.nodes}
    update: dict[str, Any] = {"nodes": [by_name[n] for n in group.nodes], "groups": [],
                              "parallelism": group.parallelism or config.parallelism}
    if index > 0:
        proxy = config.api.proxy
        update["api"] = config.api.model_copy(update={"proxy": proxy.model_copy(update={"enabled": False})})
        head = by_name[group.nodes[0]]
        if proxy.enabled and config.serving.host in LOOPBACK:
            host = str(control_ip(config, head) or head.management_ip)
            update["serving"] = config.serving.model_copy(update={"host": host})
        if proxy.enabled:
            # vLLM's key guards only /v1 paths (vllm/entrypoints/serve/middleware/authenticate.py:20-22, 47-60):
            # behind the front door only its nginx may reach this group's API server, as a hybrid node's
            # (listeners.proxy_upstream_sources), never the private networks or firewall.api_sources
            update["firewall"] = config.firewall.model_copy(update={"api_sources": [front_door_source(config)]})
    # model_copy, not a new validation: the parts were validated as the stack's, secret markers included
    return config.model_copy(update=update)


def front_door_source(config: StackConfig) -> str:
    """The address the front door's nginx connects to the other groups from, as a CIDR: the stack head's
    control-plane address (the groups' API servers bind theirs, on the same `fabric.control_plane` network)."""
    head = config.head
    return str(ipaddress.ip_network(control_ip(config, head) or head.management_ip))


def front_door_peers(config: StackConfig) -> tuple[Peer, ...]:
    """Every other group's API server, where the front door on the stack's head reaches it."""
    peers = []
    for i in range(1, len(config.groups)):
        sub = group_config(config, i)
        peers.append(Peer(config.groups[i].name, sub.serving.host, sub.serving.port))
    return tuple(peers)


def contexts(config: StackConfig) -> list[tuple[GroupConfig, StackConfig, GroupContext]]:
    """Per group: its entry, its config as a stack of its own, and what its plan must know of the others."""
    fronted = config.api.proxy.enabled
    settings = config.disaggregation
    pd = disaggregated(config) and settings is not None
    peers = front_door_peers(config) if fronted and not pd else ()
    subs = [group_config(config, i) for i in range(len(config.groups))]
    out = []
    for i, g in enumerate(config.groups):
        context = GroupContext(g.name, i, peers if i == 0 else (), config.head.name if fronted and i > 0 else None)
        if pd and settings is not None and g.role in ROLES:
            others = [ip for j, o in enumerate(config.groups) if o.role not in (g.role, "replica")
                      for ip in cluster_addresses(subs[j])]
            router = (LOOPBACK[0], settings.router.port) if i == 0 else None
            context = dataclasses.replace(context, role=g.role, disaggregation=settings,
                                          kv_args=tuple(kv_transfer_args(settings, g.role)),
                                          tier_sources=tuple(collapse(others)), router=router)
        out.append((g, subs[i], context))
    return out


def rolling(config: StackConfig) -> Rolling:
    """Can an image or argv change replace one group at a time, with the others serving?"""
    if not config.groups:
        par = config.parallelism
        shape = f"DP{par.data} x TP{par.tensor} x PP{par.pipeline}" + (" with EP" if par.expert else "")
        return Rolling(False, f"one engine group spans every rank ({shape} over {len(config.nodes)} node(s)); vLLM "
                       "runs it fail-stop, so a change replaces it whole. To roll, declare independent replica "
                       "groups (groups:, docs/rolling.md)", ("(all)",))
    names = tuple(g.name for g in config.groups)
    if disaggregated(config):
        return Rolling(False, "prefill/decode groups: every request passes through both tiers and the router, "
                       "which has no drain; a change replaces the groups it touches (a decode-only change only the "
                       "decode groups), one after another", names)
    if not config.api.proxy.enabled:
        return Rolling(False, "no front door (api.proxy.enabled: false): clients call a group directly, so "
                       "taking one out would fail their requests; a change replaces the groups one at a time "
                       "without draining them", names)
    return Rolling(True, f"{len(names)} independent groups behind the front door: each is drained, replaced, "
                   "checked and put back in turn", names)

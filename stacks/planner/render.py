"""Human-readable plan: a summary of at most SUMMARY_MAX_LINES lines first, then the full detail (the topology
table, each node in start order, listeners, firewall, checks, warnings, notes)."""

from __future__ import annotations

import shlex
import textwrap

from stacks.model.project import STACKS
from stacks.planner.plan import NodePlan, Plan
from stacks.planner.router import ROUTER_VERSION, router_argv, router_url
from stacks.planner.stack_plan import StackPlan

SUMMARY_MAX_LINES = 25
"""The summary fits one screen whatever the node count: runs of nodes with one role collapse to one line."""
NODE_LINES = 6
"""At most this many node lines; beyond, one line per role."""
SHOWN_WARNINGS = 3
WIDTH = 118
SEPARATOR = "=" * 30 + " full plan " + "=" * 30


EXACT_MATCH_ENV = ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA")
"""Variables whose value NCCL reads as a prefix unless it starts with '=' (exact names only)."""


def _cut(text: str, width: int = WIDTH) -> str:
    """One line of at most `width` characters, cut after a whole word (a cut word reads as a different one)."""
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    head = text[:width - 1]
    space = head.rfind(" ")
    return (head[:space] if space > width // 2 else head).rstrip(" ,;(") + "…"  # ':' may end an IPv6 address


def _ranks(ranks: list[int]) -> str:
    if not ranks:
        return ""
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"DP ranks {ranks[0]}-{ranks[-1]}"
    return ("DP rank " if len(ranks) == 1 else "DP ranks ") + ",".join(map(str, ranks))


def _node_lines(nodes: list[NodePlan]) -> list[str]:
    """One line per run of consecutive nodes with one role (`node3..node128 (126 nodes)`), or one per role when
    the runs would not fit NODE_LINES lines."""
    runs: list[list[NodePlan]] = []
    for node in nodes:
        if runs and runs[-1][0].role == node.role:
            runs[-1].append(node)
        else:
            runs.append([node])
    if len(runs) > NODE_LINES:
        by_role: dict[str, list[NodePlan]] = {}
        for node in nodes:
            by_role.setdefault(node.role, []).append(node)
        return [f"   {len(group)} x {role}: {_cut(', '.join(n.name for n in group), 80)}"
                for role, group in by_role.items()]
    lines = []
    for run in runs:
        first, last = run[0], run[-1]
        ranks = _ranks([r for n in run for r in n.dp_ranks])
        gpus = sum(n.gpus_used for n in run)
        where = f"{first.name} ({first.host})" if len(run) == 1 else f"{first.name}..{last.name} ({len(run)} nodes)"
        lines.append(f"   {where:<34} {first.role:<16} {gpus:>4} GPUs  {ranks}".rstrip())
    return lines


def render_summary(plan: Plan, full_below: bool = True) -> list[str]:
    """At most SUMMARY_MAX_LINES lines: what runs where, memory per GPU, warnings and checks at a glance."""
    t, mem = plan.topology, plan.summary.memory
    digest = "pinned by digest" if plan.image["digest"] else "NOT pinned by digest"
    known = "" if plan.image["known"] or plan.image.get("card") else ", not a known image: no card"
    lines = [
        f"stack {plan.stack}: {plan.model['served_name']} ({plan.model['profile']}) on {t['nodes']} node(s), "
        f"{t['gpus_used']} GPUs; endpoint {plan.endpoint}",
        *rehearsal_summary(plan),
        _cut(f"image {plan.image['ref']} ({digest}{known})"),
        f"topology {t['label']}: backend {t['backend']}, TP{t['tensor']} PP{t['pipeline']} DP{t['data']} "
        f"EP{t['expert'] or '-'}",
        "nodes:",
        *_node_lines(plan.nodes),
        f"memory per GPU: {mem.per_gpu_gb:.1f} of {mem.budget_gb:.1f} GB ({mem.node}: {mem.gpu_gb:g} GB x "
        f"{mem.utilization}), {mem.left_gb:.1f} GB left for the KV cache of more sequences",
        f"   weights {mem.weights_gb:.1f} + KV of one full-length sequence {mem.kv_one_sequence_gb:.1f} + runtime "
        f"reserve {mem.reserve_gb:g} GB",
    ]
    if mem.engram == "host":
        lines.append(f"host RAM: {mem.host_pinned_gb_per_node:.0f} GB pinned per node for Engram tables "
                     "(the preflight checks MemTotal)")
    elif mem.engram == "gpu":  # a model without Engram tables pins nothing: no line to read
        lines.append("host RAM: no pinned tables (Engram tables in GPU memory)")
    lines.append(f"warnings ({len(plan.warnings)})" + (":" if plan.warnings else ": none"))
    lines += [f"   - {_cut(w, WIDTH - 5)}" for w in plan.warnings[:SHOWN_WARNINGS]]
    if len(plan.warnings) > SHOWN_WARNINGS:
        where = "under 'warnings:' below" if full_below else "in the full plan (without --summary)"
        lines.append(f"   (+{len(plan.warnings) - SHOWN_WARNINGS} more; every warning in full {where})")
    kinds = ", ".join(f"{kind} x{count}" if count > 1 else kind
                      for kind, count in plan.summary.checks_by_kind.items())
    wrapped = textwrap.wrap(f"checks ({len(plan.checks)}): {kinds}", WIDTH, subsequent_indent="   ",
                            break_on_hyphens=False)
    lines += wrapped[:3] if len(wrapped) <= 3 else [*wrapped[:2], _cut(" ".join(wrapped[2:]))]
    return lines


REHEARSAL_LINE = ("REHEARSAL: no node has a GPU (vllm-cluster:rehearsal: true): a substitute engine, not vLLM on GPUs; "
                  "GPUs pretended")
"""The first words of a rehearsal's plan (docs/rehearsal.md): what deploys is not a model served on GPUs."""


def rehearsal_summary(plan: Plan) -> list[str]:
    """Two summary lines for a stack that declares no GPUs; none for a GPU stack."""
    if plan.rehearsal is None:
        return []
    kinds = ", ".join(dict.fromkeys(line.split(": NOT RUN", 1)[0].split(" x", 1)[0]
                                    for line in plan.rehearsal.not_run))
    return [REHEARSAL_LINE, "   " + _cut(f"no container gets a GPU; these print NOT RUN and why: {kinds}", WIDTH - 3)]


def rehearsal_detail(plan: Plan) -> list[str]:
    """The rehearsal's section of the full plan: what serves, what is pretended, what does not run and why."""
    r = plan.rehearsal
    if r is None:
        return []

    def items(texts: list[str]) -> list[str]:
        return [line for text in texts for line in textwrap.wrap(
            text, WIDTH, initial_indent="   - ", subsequent_indent="     ", break_on_hyphens=False)]

    return [REHEARSAL_LINE, *textwrap.wrap(f"engine: {r.engine}", WIDTH, initial_indent="   ",
                                           subsequent_indent="     ", break_on_hyphens=False),
            "   pretended GPUs (nodes[].gpus.count): " + ", ".join(f"{n} {g}" for n, g in r.pretended_gpus.items()),
            "   not run (each check prints `NOT RUN <what>: <why>` when it runs):", *items(r.not_run),
            "   on CPU:", *items(r.on_cpu), "   the engine image must hold:", *items(r.image_needs), ""]


def render_plan(plan: Plan, full: bool = True) -> str:
    """The summary, then (unless `full` is false) the whole plan after a separator line."""
    summary = render_summary(plan, full_below=full)
    if not full:
        return "\n".join(summary)
    return "\n".join([*summary, "", SEPARATOR, "", render_detail(plan)])


def render_stack(whole: StackPlan, full: bool = True) -> str:
    """A stack without groups: its plan. With groups: what rolls and how, then every group's plan."""
    if not whole.grouped:
        return render_plan(whole.groups[0].plan, full)
    roll = whole.rolling
    n = len(whole.groups)
    if whole.router is None:
        members = ", ".join(f"{g.name} ({', '.join(n.name for n in g.plan.nodes)})" for g in whole.groups)
        head = [f"stack {whole.stack}: {n} replica groups: {members}"]
    else:
        members = ", ".join(f"{g.name} ({g.context.role if g.context else '?'}: "
                            f"{', '.join(n.name for n in g.plan.nodes)})" for g in whole.groups)
        r = whole.router
        head = [f"stack {whole.stack}: {n} prefill/decode groups: {members}",
                f"router vllm-router {ROUTER_VERSION} on {whole.groups[0].plan.head.name} at {router_url(r)} "
                f"(policy {r.policy}), behind the front door: prefill {', '.join(r.prefill_urls)}; decode "
                f"{', '.join(r.decode_urls)}",
                f"   {shlex.join(router_argv(r))}",
                f"   after every group: router-wheel (the pinned wheel, sha256-checked, on "
                f"{whole.groups[0].plan.head.name}) -> the router container -> check-pd (the golden prompt through "
                "the router with the decode's KV evidence, and every prefill x decode pair)"]
    lines = [*head, (f"a change rolls: {roll.why}; {n - 1} of {n} groups serve meanwhile" if roll.can_roll
                     else f"a change does not roll: {roll.why}"), ""]
    for g in whole.groups:
        lines += [f"{'#' * 30} group {g.name} {'#' * 30}", "", render_plan(g.plan, full), ""]
    return "\n".join(lines).rstrip("\n")


def render_detail(plan: Plan) -> str:
    t = plan.topology
    lines = [
        f"stack {plan.stack}: {plan.model['served_name']} ({plan.model['profile']})",
        f"image {plan.image['ref']} digest {plan.image['digest'] or '- (not pinned)'}"
        + ("" if plan.image["known"] or plan.image.get("card") else "  [not a known image: no card]"),
        f"topology {t['label']}: backend={t['backend']} nodes={t['nodes']} tensor={t['tensor']} "
        f"pipeline={t['pipeline']} data={t['data']} expert={t['expert'] or 'off'} gpus_used={t['gpus_used']}",
        f"endpoint {plan.endpoint}",
        "",
        *rehearsal_detail(plan),
        f"{'node':<16} {'host':<18} {'role':<16} {'gpus':>9}  dp ranks",
    ]
    for n in plan.nodes:
        ranks = ",".join(map(str, n.dp_ranks)) or "-"
        if n.node_rank is not None:
            ranks += f"  (node-rank {n.node_rank}, replica {n.replica})"
        lines.append(f"{n.name:<16} {n.host:<18} {n.role:<16} {n.gpus_used:>4}/{n.gpus_present:<4}  {ranks}")
    order = " -> ".join(plan.start_order)
    if any(len(n.containers) > 1 for n in plan.nodes):  # external load balancing: a container per DP rank
        order += (f" (each node's rank containers in the order listed below; on {plan.head.name} "
                  f"{plan.head.containers[-1].name} last)")
    lines += ["", "start order: " + order,
              "on an image or launch change: pull on every node -> preflights -> argument dry run in the new "
              "image on every node -> replace the whole group in start order"
              + ("" if plan.group else " (it cannot roll: one engine group spans every rank, so vLLM runs it "
                 "fail-stop; declare replica groups to roll, docs/rolling.md)"), ""]
    for name in plan.start_order:
        node = plan.node(name)
        for c in node.containers:
            lines.append(f"== {node.name} ({node.role}): container {c.name} — {c.purpose}")
            for key, value in c.env.items():
                exact = ("   (the leading '=': exactly this name, not a prefix)"
                         if key in EXACT_MATCH_ENV and value.startswith("=") else "")
                lines.append(f"   env {key}={value}{exact}")
            for key, ref in c.secret_env.items():
                lines.append(f"   env {key}=[secret] (Pulumi secret {ref})")
            if c.entrypoint:
                lines.append(f"   entrypoint {shlex.join(c.entrypoint)}")
            if c.vllm_args is not None:
                lines.append("   vllm serve " + " \\\n       ".join(_pairs(c.vllm_args)))
            if c.entrypoint:
                lines.append("   command:")
                lines += [f"     {line}" for line in "\n".join(c.command).splitlines()]
            ulimits = " ".join(f"{k}={v[0]}:{v[1]}" for k, v in c.ulimits.items())
            vols = " ".join(f"{v.host}:{v.container}{':ro' if v.read_only else ''}" for v in c.volumes)
            lines.append(f"   network={c.network_mode} ipc={c.ipc_mode} privileged={c.privileged} gpus={c.gpus} "
                         f"restart={c.restart}" + (f" shm={c.shm_size_mb}MB" if c.shm_size_mb else "")
                         + f" ulimits {ulimits}")
            lines.append(f"   volumes {vols}" + (f" devices {' '.join(c.devices)}" if c.devices else ""))
            lines.append("")
    if plan.proxy is not None:
        px = plan.proxy
        lim = px.limits
        lines += [
            f"== {px.node}: container {px.container} — nginx front door ({px.image})",
            f"   listen {px.listen} {'TLS' if px.tls else 'plain HTTP'} -> vLLM {px.upstream} (with api_key)",
            f"   clients {', '.join(px.clients)} (keys are secrets; checks use {px.check_client})",
            f"   allow {' '.join(px.allowed_paths)} (no key: {' '.join(px.open_paths)}); "
            f"403 {len(px.denied_paths)} named vLLM paths ({', '.join(px.denied_paths[:2])}, …; from the "
            f"{px.denied_from}); "
            "404 the rest",
            f"   limits {lim['requests_per_minute_per_key']}/min per key, {lim['requests_per_minute_per_client']}/min "
            f"per client IP, burst {lim['burst']}, {lim['connections_per_key']} open per key, "
            f"{lim['connections_per_client']} per client IP; body <= {px.max_body_mb} MB; "
            f"SSE unbuffered, read timeout {px.read_timeout_s}s",
            "",
        ]
    if plan.observability is not None:
        ob = plan.observability
        lines.append(f"== monitoring on {ob.node}: Prometheus {ob.prometheus}, Grafana {ob.grafana}, "
                     + (f"Alertmanager {ob.alertmanager}" if ob.alertmanager else "no Alertmanager (no webhook)")
                     + f"; watch unit scraped at {ob.watch_target}, group supervisor at {ob.supervisor_target}")
        for mc in ob.containers:
            lines.append(f"   {mc.node}: container {mc.name} ({mc.role}, {mc.image}) listen {mc.listen}")
        lines.append(f"   {len(ob.files)} generated files ({STACKS} observability {plan.stack} --out DIR)")
        lines.append("")
    lines += render_listeners(plan)
    lines += ["", "checks:"]
    for check in plan.checks:
        lines.append(f"   {check.name:<28} on {check.node or 'deployer':<12} {check.proves}")
    for title, items in (("warnings", plan.warnings), ("notes", plan.notes)):
        if items:
            lines += ["", f"{title}:"] + [f"   - {item}" for item in items]
    return "\n".join(lines)


def _pairs(args: list[str]) -> list[str]:
    """Group `--flag value` pairs so each flag reads on one line."""
    out: list[str] = []
    for arg in args:
        if out and not arg.startswith("--") and out[-1].startswith("--") and " " not in out[-1]:
            out[-1] = f"{out[-1]} {shlex.quote(arg)}"
        else:
            out.append(shlex.quote(arg))
    return out


def render_listeners(plan: Plan) -> list[str]:
    """The listener table: what binds where (`::` = every IPv4 and IPv6 address), who must reach it, what the host
    firewall admits, and the upstream code each bind was read from (numbered footnotes)."""
    fw = plan.firewall
    cluster = {n.node: n.cluster_sources for n in fw.nodes}
    sources: dict[str, int] = {}
    lines = ["listening ports (bind is what the socket really binds; :: = all IPv4 and IPv6 addresses, "
             f"ephemeral = any port of {fw.ephemeral_ports}, picked by the OS):",
             f"   {'node':<12} {'role':<15} {'port':<11} {'bind':<16} {'network':<10} {'reach':<7} "
             f"{'firewall admits':<24} purpose [source]"]
    for x in plan.listeners:
        ref = sources.setdefault(x.source, len(sources) + 1)
        if not x.allowed_sources:
            admits = "- (this host)"
        elif "0.0.0.0/0" in x.allowed_sources:
            admits = "anywhere"
        elif x.internal and x.allowed_sources == cluster.get(x.node):
            admits = "cluster"
        else:
            admits = ", ".join(x.allowed_sources)
        port = "ephemeral" if x.ephemeral else (f"{x.port}-{x.port_end}" if x.port_end else str(x.port))
        lines.append(f"   {x.node:<12} {x.role:<15} {port:<11} {x.bind:<16} {x.network:<10} {x.reach:<7} "
                     f"{admits:<24} {x.purpose} [{ref}]" + ("  PUBLIC" if x.public else ""))
    lines.append("   sources:")
    lines += [f"   [{n}] {src}" for src, n in sources.items()]
    lines.append("")
    if not fw.enabled:
        lines.append("host firewall: OFF (firewall.enabled: false): nothing filters the ports above")
        return lines
    lines.append(f"host firewall: table {fw.table} on every node, chain input policy accept; drops only new "
                 "connections to these ports from other sources; SSH and every other port untouched:")
    for n in fw.nodes:
        api = f"; API {', '.join(n.api_ports)} from {', '.join(n.api_sources)}" if n.api_ports else ""
        if n.upstream_ports:
            who = ", ".join(f"{c} ({w})" for c, w in zip(n.upstream_sources, n.upstream_who, strict=True))
            api += f"; API behind the proxy {', '.join(n.upstream_ports)} only from {who}"
        unrestricted = ", ".join(f"{p} (API, see its sources)" if p in n.api_ports else f"{p} (ssh)"
                                 for p in n.kept_open)
        lines.append(f"   {n.node}: {', '.join(n.internal_ports) or '-'} from {', '.join(n.cluster_sources)}{api}; "
                     f"not restricted to the cluster: {unrestricted} (sha256 {n.sha256[:12]})")
    return lines

"""Human-readable plan: the topology table first, then each node in start order."""

from __future__ import annotations

import shlex

from stacks.planner.plan import Plan


def render_plan(plan: Plan) -> str:
    t = plan.topology
    lines = [
        f"stack {plan.stack}: {plan.model['served_name']} ({plan.model['profile']})",
        f"image {plan.image['ref']} digest {plan.image['digest'] or '- (not pinned)'}"
        + ("" if plan.image["known"] else "  [not in capability table]"),
        f"topology {t['label']}: backend={t['backend']} nodes={t['nodes']} tensor={t['tensor']} "
        f"pipeline={t['pipeline']} data={t['data']} expert={t['expert'] or 'off'} gpus_used={t['gpus_used']}",
        f"endpoint {plan.endpoint}",
        "",
        f"{'node':<16} {'host':<18} {'role':<16} {'gpus':>9}  dp ranks",
    ]
    for n in plan.nodes:
        ranks = ",".join(map(str, n.dp_ranks)) or "-"
        if n.node_rank is not None:
            ranks += f"  (node-rank {n.node_rank}, replica {n.replica})"
        lines.append(f"{n.name:<16} {n.host:<18} {n.role:<16} {n.gpus_used:>4}/{n.gpus_present:<4}  {ranks}")
    lines += ["", "start order: " + " -> ".join(plan.start_order),
              "on an image or launch change: pull on every node -> preflights -> argument dry run in the new "
              "image on every node -> replace the whole group in start order", ""]
    for name in plan.start_order:
        node = plan.node(name)
        for c in node.containers:
            lines.append(f"== {node.name} ({node.role}): container {c.name} — {c.purpose}")
            for key, value in c.env.items():
                lines.append(f"   env {key}={value}")
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
                         f"restart={c.restart} shm={c.shm_size_mb or '-'}MB ulimits {ulimits}")
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
                     + f"; watch unit scraped at {ob.watch_target}")
        for mc in ob.containers:
            lines.append(f"   {mc.node}: container {mc.name} ({mc.role}, {mc.image}) listen {mc.listen}")
        lines.append(f"   {len(ob.files)} generated files (python -m stacks observability {plan.stack} --out DIR)")
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
        lines.append(f"   {n.node}: {', '.join(n.internal_ports) or '-'} from {', '.join(n.cluster_sources)}{api}; "
                     f"kept open: {', '.join(n.kept_open)} (sha256 {n.sha256[:12]})")
    return lines

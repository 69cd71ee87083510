"""Human-readable plan: the topology table first, then each node in start order."""

from __future__ import annotations

import shlex

from stacks.plan import Plan


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
            f"403 {len(px.denied_paths)} named vLLM paths (/metrics, /tokenize, …); 404 the rest",
            f"   limits {lim['requests_per_minute_per_key']}/min per key, {lim['requests_per_minute_per_client']}/min "
            f"per client IP, burst {lim['burst']}, {lim['connections_per_key']} open per key, "
            f"{lim['connections_per_client']} per client IP; body <= {px.max_body_mb} MB; "
            f"SSE unbuffered, read timeout {px.read_timeout_s}s",
            "",
        ]
    lines.append("listening ports:")
    for item in plan.listeners:
        lines.append(f"   {item.node}:{item.port} bind {item.bind} ({item.network}) {item.purpose}"
                     + ("  PUBLIC" if item.public else ""))
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

"""The host firewall: one nftables table per node that makes the listener table's "internal" true.

Every internal port of a node (`stacks.planner.listeners`: Ray's gRPC servers, torch TCPStores, vLLM's ZMQ sockets, and
the whole ephemeral range for the OS-picked ones) accepts new connections only from the cluster's own addresses
and `fabric.private_networks`; the API/proxy port only from `firewall.api_sources`; a vLLM API port behind the
proxy on a node after the head (hybrid load balancing) only from the head's nginx and Prometheus
(`stacks.planner.listeners.proxy_upstream_sources`). Nothing else is touched:

- one table, `table inet vllm_cluster`, owned by this project; applied as `add table` + `delete table` + the
  definition in one `nft -f` file, which the kernel applies as one transaction (all or nothing, the old table
  stays when a line fails); removed with `delete table inet vllm_cluster`. Other tables (Docker's `ip filter`
  / `ip nat`, the operator's) are never named.
- the chain is `policy accept` and only drops: SSH, every node's `ssh.port` and every port outside the sets
  pass exactly as before, so a wrong rule cannot lock the deployer out. `iif lo` and `ct state
  established,related` are accepted first: local clients, and replies to the node's own outgoing connections
  (whose local ports are ephemeral too), are never affected.
- Docker: host-network containers (every container of this project) are processes of the host's network
  namespace, so their inbound packets go PREROUTING -> INPUT like any host socket; Docker's own chains are
  FORWARD (bridge containers) and nat PREROUTING/OUTPUT DNAT for published ports, which host networking has
  none of. In nftables a packet must pass every base chain of a hook and a `drop` in any of them is final, so
  an `accept` in Docker's `ip filter INPUT` cannot undo ours, nor ours theirs (tests/test_firewall_netns.py).
- a reboot clears kernel tables: the apply script keeps the file in `/etc/vllm-cluster/firewall.nft` and, where
  systemd runs, a oneshot unit loads it before `docker.service` starts the containers again.
"""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from stacks.model.config import NodeConfig, StackConfig
from stacks.planner.exposure import ANYWHERE, NFT_MARKER
from stacks.planner.listeners import Listener, api_sources, collapse, internal_sources, proxy_upstream_sources

FAMILY = "inet"
TABLE = "vllm_cluster"
STATE_DIR = "/etc/vllm-cluster"
UNIT_DIR = "/etc/systemd/system"
UNIT = "vllm-cluster-firewall.service"
APPLY_TIMEOUT_S = 120

PortRange = tuple[int, int]


class NodeFirewall(BaseModel):
    """What one node's table lets in, as the plan shows it."""

    model_config = ConfigDict(frozen=True)
    node: str
    internal_ports: list[str]
    """Ports and ranges that only the cluster sources may open connections to."""
    api_ports: list[str]
    cluster_sources: list[str]
    api_sources: list[str]
    kept_open: list[str]
    """Ports left out of the cluster-only rule: SSH (not filtered at all) and the API ports (filtered by their
    own `api_sources`)."""
    sha256: str
    """Of the applied file: the command resource's trigger."""
    upstream_ports: list[str] = []
    """vLLM's API port behind the proxy on a node after the head (hybrid): only `upstream_sources` may connect."""
    upstream_sources: list[str] = []
    upstream_who: list[str] = []
    """Who each of `upstream_sources` is (same order): the head's nginx, Prometheus."""


class FirewallPlan(BaseModel):
    model_config = ConfigDict(frozen=True)
    enabled: bool
    table: str
    ephemeral_ports: str
    nodes: list[NodeFirewall]


def firewall_plan(config: StackConfig, listeners: list[Listener], peers: tuple[str, ...] = ()) -> FirewallPlan:
    """`peers`: more addresses admitted to the internal ports, a prefill/decode group's other tier
    (stacks/planner/groups.py `GroupContext.tier_sources`): its NIXL handshakes and UCX transfers."""
    fw = config.firewall
    by_node: dict[str, list[Listener]] = {}
    for x in listeners:
        by_node.setdefault(x.node, []).append(x)
    cluster, api = internal_sources(config), api_sources(config)   # once: they hold every node's addresses
    if peers and fw.enabled:
        cluster = collapse([*cluster, *peers])
    nodes = [node_firewall(config, by_node.get(n.name, []), n, cluster=cluster, api=api)
             for n in config.nodes] if fw.enabled else []
    low, high = fw.ephemeral_ports
    return FirewallPlan(enabled=fw.enabled, table=f"{FAMILY} {TABLE}", ephemeral_ports=f"{low}-{high}", nodes=nodes)


def node_firewall(config: StackConfig, listeners: list[Listener], node: NodeConfig, *,
                  cluster: list[str] | None = None, api: list[str] | None = None) -> NodeFirewall:
    mine = [x for x in listeners if x.node == node.name]
    api_ports = merge([(x.port, x.port_end or x.port) for x in mine if x.reach == "clients"])
    upstream = merge([(x.port, x.port_end or x.port) for x in mine if x.reach == "proxy"])
    keep = merge([(22, 22), (node.ssh.port, node.ssh.port)])
    internal = subtract(merge([(x.port, x.port_end or x.port) for x in mine if x.reach not in ("clients", "proxy")]),
                        [*api_ports, *keep, *upstream])
    who = proxy_upstream_sources(config, node) if upstream else []
    spec = NodeFirewall(
        node=node.name, internal_ports=[_fmt(r) for r in internal], api_ports=[_fmt(r) for r in api_ports],
        cluster_sources=internal_sources(config) if cluster is None else cluster,
        api_sources=(api_sources(config) if api is None else api) if api_ports else [],
        kept_open=[_fmt(r) for r in merge([*keep, *api_ports])], sha256="",
        upstream_ports=[_fmt(r) for r in upstream], upstream_sources=[c for c, _ in who],
        upstream_who=[w for _, w in who])
    return spec.model_copy(update={"sha256": hashlib.sha256(apply_file(spec).encode()).hexdigest()})


def merge(ranges: list[PortRange]) -> list[PortRange]:
    """Sorted, non-overlapping, adjacent ranges joined: nft refuses overlapping intervals in a set."""
    out: list[PortRange] = []
    for low, high in sorted(ranges):
        if out and low <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], high))
        else:
            out.append((low, high))
    return out


def subtract(ranges: list[PortRange], holes: list[PortRange]) -> list[PortRange]:
    out = merge(ranges)
    for h_low, h_high in merge(holes):
        cut: list[PortRange] = []
        for low, high in out:
            if h_high < low or h_low > high:
                cut.append((low, high))
                continue
            if low < h_low:
                cut.append((low, h_low - 1))
            if h_high < high:
                cut.append((h_high + 1, high))
        out = cut
    return out


def _fmt(r: PortRange) -> str:
    return str(r[0]) if r[0] == r[1] else f"{r[0]}-{r[1]}"


def _split(cidrs: list[str]) -> tuple[list[str], list[str]]:
    """IPv4 and IPv6 elements; the lists come canonical from `stacks.planner.listeners.collapse`."""
    return [c for c in cidrs if ":" not in c], [c for c in cidrs if ":" in c]


@dataclass(frozen=True)
class _Set:
    name: str
    kind: str
    elements: list[str]

    def render(self) -> list[str]:
        lines = [f"\tset {self.name} {{", f"\t\ttype {self.kind}", "\t\tflags interval"]
        if self.elements:
            lines.append(f"\t\telements = {{ {', '.join(self.elements)} }}")
        return [*lines, "\t}", ""]


def render_table(spec: NodeFirewall) -> str:
    """The table definition (nft syntax). Only sets and drops; a source list of "anywhere" gets no rule."""
    sets: list[_Set] = []
    rules = ["\t\tiif \"lo\" accept", "\t\tct state established,related accept"]
    whys = {"internal": "internal port, source outside the cluster", "api": "API port, source not allowed",
            "upstream": "API port behind the proxy, source not the proxy"}
    for label, ports, sources in (("internal", spec.internal_ports, spec.cluster_sources),
                                  ("api", spec.api_ports, spec.api_sources),
                                  ("upstream", spec.upstream_ports, spec.upstream_sources)):
        if not ports or set(ANYWHERE) <= set(sources):
            continue  # anywhere: a rule would drop nothing
        v4, v6 = _split(sources)
        sets += [_Set(f"{label}_ports", "inet_service", ports), _Set(f"{label}_v4", "ipv4_addr", v4),
                 _Set(f"{label}_v6", "ipv6_addr", v6)]
        why = whys[label]
        rules += [f"\t\ttcp dport @{label}_ports ip saddr != @{label}_v4 counter drop comment \"{why}\"",
                  f"\t\ttcp dport @{label}_ports ip6 saddr != @{label}_v6 counter drop comment \"{why}\""]
    lines = [f"table {FAMILY} {TABLE} {{"]
    for s in sets:
        lines += s.render()
    lines += ["\tchain input {", "\t\ttype filter hook input priority filter; policy accept;", *rules, "\t}", "}"]
    return "\n".join(lines) + "\n"


def owner_line(node: str) -> str:
    """The file's first line: whose rules these are (the delete of another node's resource leaves them)."""
    return f"# vllm-cluster host firewall for node {node}: generated by stacks/planner/firewall.py, applied by Pulumi."


def apply_file(spec: NodeFirewall) -> str:
    """What `nft -f` reads: create-if-missing, delete, define — one transaction, idempotent."""
    return "\n".join([
        owner_line(spec.node),
        "# Only this table; policy accept; drops new connections to the listed ports from other sources.",
        f"add table {FAMILY} {TABLE}",
        f"delete table {FAMILY} {TABLE}",
        render_table(spec),
    ])


@dataclass(frozen=True)
class FirewallCommand:
    """What a `pulumi_command.remote.Command` needs: create/update = apply, delete = remove; no triggers.

    A rules change must be an update (the new table replaces the old one atomically in `nft -f`), never a
    replacement: Pulumi creates the replacement before it deletes the original, so the original's delete would
    remove the table the replacement had just applied, leaving the node open while the state says it is closed
    (seen on the lab when the front door was switched on). Where a replacement still happens (a state written
    with the ruleset as trigger), the program deletes the old one first; and the delete leaves the table when the
    node's rules file names another node (a node renamed in the stack, same host: `remove_script`)."""

    create: str
    update: str
    delete: str
    ruleset_sha256: str
    """The applied file's sha256: what re-runs the firewall preflight, which reads the node against these rules."""


def firewall_command(spec: NodeFirewall, node: NodeConfig, *, state_dir: str = STATE_DIR,
                     unit_dir: str = UNIT_DIR, timeout_s: int = APPLY_TIMEOUT_S) -> FirewallCommand:
    """Shell commands for the node's firewall resource (run over SSH as `nodes[].ssh.user`; `sudo -n` when that
    is not root). `timeout` because remote commands ignore Pulumi's timeouts."""
    sudo = "" if node.ssh.user == "root" else "sudo -n "
    apply = f"{sudo}timeout {timeout_s} sh -c {shlex.quote(apply_script(spec, state_dir, unit_dir))}"
    remove = f"{sudo}timeout {timeout_s} sh -c " + shlex.quote(
        remove_script(spec.node, state_dir, unit_dir, owned=True))
    return FirewallCommand(create=apply, update=apply, delete=remove, ruleset_sha256=spec.sha256)


def apply_script(spec: NodeFirewall, state_dir: str = STATE_DIR, unit_dir: str = UNIT_DIR) -> str:
    name = f"firewall-{spec.node}"
    path = f"{state_dir}/firewall.nft"
    unit = f"{unit_dir}/{UNIT}"
    return f"""set -eu
if ! command -v nft >/dev/null 2>&1; then
  echo "CANNOT-RUN {name}: nft not found | next step: apt-get install nftables (or firewall.enabled: false)"
  exit 2
fi
umask 077
mkdir -p {shlex.quote(state_dir)}
cat > {shlex.quote(path)}.new <<'{NFT_MARKER}'
{apply_file(spec)}{NFT_MARKER}
if ! out=$(nft -c -f {shlex.quote(path)}.new 2>&1); then
  echo "FAIL {name}: nft refused the ruleset, nothing changed | evidence: $out"
  exit 1
fi
if ! out=$(nft -f {shlex.quote(path)}.new 2>&1); then
  echo "FAIL {name}: nft -f failed, the previous table (if any) is unchanged | evidence: $out"
  exit 1
fi
mv {shlex.quote(path)}.new {shlex.quote(path)}
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
  cat > {shlex.quote(unit)} <<VLLM_CLUSTER_UNIT
[Unit]
Description=vllm-cluster host firewall (nftables table {FAMILY} {TABLE})
DefaultDependencies=no
Wants=network-pre.target
Before=network-pre.target docker.service
# Debian's nftables.service flushes the whole ruleset when it starts, reloads or stops: apply after it, again
# when it restarts (PartOf) or reloads (ReloadPropagatedFrom).
After=nftables.service
PartOf=nftables.service
ReloadPropagatedFrom=nftables.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=$(command -v nft) -f {path}
ExecReload=$(command -v nft) -f {path}

[Install]
WantedBy=multi-user.target
VLLM_CLUSTER_UNIT
  systemctl daemon-reload
  systemctl enable {UNIT} >/dev/null 2>&1
  boot="reloaded at boot by {UNIT}"
else
  boot="WARNING: no systemd, the table is gone after a reboot until the next pulumi up"
fi
nft list table {FAMILY} {TABLE} >/dev/null
echo "PASS {name}: table {FAMILY} {TABLE} applied (sha256 {spec.sha256[:16]}); $boot"
"""


def remove_script(node: str, state_dir: str = STATE_DIR, unit_dir: str = UNIT_DIR, owned: bool = False) -> str:
    """Deletes our table only; missing table, unit or file are fine (destroy after a manual clean-up). `owned`: only
    when the node's rules file is this node's (its first line, `owner_line`): a node renamed in the stack on the
    same host is a new resource, created before the old one is deleted, and keeps the table it applied. Not the
    whole file's hash: a hand-edited file, or an update that stopped after `nft -f`, must still be removed."""
    unit = f"{unit_dir}/{UNIT}"
    path = shlex.quote(f"{state_dir}/firewall.nft")
    left = f"PASS firewall-{node}: LEFT IN PLACE: table {FAMILY} {TABLE}, its unit and {path}: another node's rules"
    guard = "" if not owned else f"""owner={shlex.quote(owner_line(node))}
if [ -f {path} ] && [ "$(head -n 1 {path})" != "$owner" ]; then
  echo "{left} ($(head -n 1 {path} | cut -c1-80))"
  exit 0
fi
"""
    return f"""set -eu
{guard}if command -v nft >/dev/null 2>&1 && nft list table {FAMILY} {TABLE} >/dev/null 2>&1; then
  nft delete table {FAMILY} {TABLE}
fi
if [ -f {shlex.quote(unit)} ]; then
  if command -v systemctl >/dev/null 2>&1; then systemctl disable {UNIT} >/dev/null 2>&1 || true; fi
  rm -f {shlex.quote(unit)}
  if [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
fi
rm -f {shlex.quote(state_dir)}/firewall.nft {shlex.quote(state_dir)}/firewall.nft.new
rmdir {shlex.quote(state_dir)} 2>/dev/null || true
echo "PASS firewall-{node}: table {FAMILY} {TABLE} removed"
"""


def firewall_commands(config: StackConfig, plan: FirewallPlan) -> dict[str, FirewallCommand]:
    """Node name -> its command resource's create/update/delete/triggers (empty with the firewall off: Pulumi
    then runs the delete of a table an earlier update created)."""
    by_name = {n.name: n for n in config.nodes}
    return {spec.node: firewall_command(spec, by_name[spec.node]) for spec in plan.nodes}


def preflight_args(config: StackConfig) -> list[str]:
    """Arguments of `checks.preflight` for its `firewall` section: nft present and usable, and the kernel's
    ephemeral range inside `firewall.ephemeral_ports`."""
    low, high = config.firewall.ephemeral_ports
    return ["--sections", "firewall", "--ephemeral-ports", f"{low}-{high}"]

"""Rules for the hosts and the network: unique node names and addresses, addresses the nodes can reach each other
on, ports that do not clash on the head, the front door (proxy) and who may reach the API, where the API checks
call, SSH host keys. Each appends refusals (key, value, fix) or warnings to the `Validation`; `validation.validate`
calls them after the topology and model rules."""

from __future__ import annotations

import ipaddress
from collections import Counter

from stacks.model.config import NodeConfig, StackConfig
from stacks.model.errors import Problem
from stacks.model.field_types import bracket_host, is_ip_literal
from stacks.planner.exposure import (
    API_EXPOSURE_FIX,
    MONITORING_EXPOSURE_FIX,
    UNGUARDED_MONITOR_FIX,
    WILDCARDS,
    api_exposed,
    api_exposure_message,
    is_loopback,
    monitoring_exposed,
    monitoring_exposure_message,
    private_network_findings,
    unguarded_monitor_problem,
)
from stacks.planner.fabric import control_ip
from stacks.planner.findings import Validation
from stacks.planner.listeners import api_sources, cluster_addresses, collapse, internal_sources
from stacks.planner.proxy import routes_problems
from stacks.planner.topology import replica_spans_nodes


def uniqueness_rules(config: StackConfig, result: Validation) -> None:
    """Names unique; every node address (management, data, a literal SSH host) belongs to one node only: the head's
    DP address or an SSH host that is another node's address sends traffic, or a deploy, to the wrong machine."""
    names = [n.name for n in config.nodes]
    for i, name in enumerate(names):
        if name in names[:i]:
            result.problems.append(Problem(f"nodes.{i}.name", name, "used by more than one node",
                                           fix="a unique value per node"))
    owner: dict[str, tuple[int, str]] = {}
    for i, node in enumerate(config.nodes):
        addresses = _node_addresses(node)
        if is_ip_literal(node.ssh.host):
            addresses.append(("ssh.host", str(ipaddress.ip_address(node.ssh.host))))
        data: set[str] = set()  # one NIC may carry the management address too; two NICs never share one
        for key, address in addresses:
            if address in owner and owner[address][0] != i:
                other, other_key = owner[address]
                result.problems.append(Problem(
                    f"nodes.{i}.{key}", address, f"is node {config.nodes[other].name}'s {other_key} too: one address, "
                    "one node", fix="this node's own address"))
            elif key.startswith("data_ips"):
                if address in data:
                    result.problems.append(Problem(f"nodes.{i}.{key}", address, "data-plane IP used twice",
                                                   fix="a unique data-plane IP per NIC"))
                data.add(address)
            owner.setdefault(address, (i, key))
    hosts = [(n.ssh.host, n.ssh.port) for n in config.nodes]
    for i, host in enumerate(hosts):
        if host in hosts[:i]:
            result.problems.append(Problem(f"nodes.{i}.ssh.host", host[0], "another node is reached at the same SSH "
                                           "host and port: both would be deployed on one machine",
                                           fix="this node's own SSH address (or its own port for a tunnel)"))


def _node_addresses(node: NodeConfig) -> list[tuple[str, str]]:
    """(config key below the node, address) of the node's management and data-plane IPs."""
    return [("management_ip", node.management_ip), *[(f"data_ips.{k}", ip) for k, ip in enumerate(node.data_ips)]]


def _stray_address_warnings(config: StackConfig) -> list[str]:
    """A node address that sits apart from the other nodes' same address (management IP, or the same rail's data
    IP), judged by `fabric.private_networks`: most likely a typo (192.168.2.22 for 192.168.20.22). Warned when it
    is in none of the networks while another node's is in one; when it is in the network of the other role (a
    data IP on the management network, or the reverse) while no other node's is; or when more than half of the
    nodes share one network and it is elsewhere. A warning, not a refusal: a routed fabric can put a node on a
    network of its own, and two racks in two networks are not told apart from a typo (no majority: no warning)."""
    networks = [ipaddress.ip_network(c, strict=False) for c in config.fabric.private_networks]
    if not networks or len(config.nodes) < 2:
        return []

    def home(address: str) -> str | None:
        ip = ipaddress.ip_address(address)
        return next((str(n) for n in networks if ip.version == n.version and ip in n), None)

    by_role = {role: {home(a) for n in config.nodes for k, a in _node_addresses(n) if k.startswith(role)} - {None}
               for role in ("management", "data")}
    warnings = []
    for key in sorted({k for n in config.nodes for k, _ in _node_addresses(n)}):
        other_role = by_role["data" if key == "management_ip" else "management"]
        rows = [(i, home(a), a) for i, n in enumerate(config.nodes) if (a := dict(_node_addresses(n)).get(key))]
        every = Counter(h for _, h, _ in rows)  # None counted too: the other nodes' are every node's but one
        counts = Counter({h: c for h, c in every.items() if h is not None})
        major, many = counts.most_common(1)[0] if counts else (None, 0)
        for i, mine, address in rows:
            housed = sum(counts.values()) - (mine is not None)  # other nodes inside a declared network
            if mine is None and housed:
                where = f"is in none of fabric.private_networks ({', '.join(map(str, networks))})"
            elif mine is not None and mine in other_role and len(rows) > 1 and every[mine] == 1:
                where = f"is on the {'data' if key == 'management_ip' else 'management'} network {mine}"
            elif mine != major and 2 * many > len(rows):
                where = f"is in {mine}"
            else:
                continue
            peers = Counter(h or "none of them" for j, h, _ in rows if j != i)  # only for a warning: rare
            said = ", ".join(f"{c} in {h}" for h, c in peers.most_common())
            warnings.append(
                f"nodes.{i}.{key}: {address} ({config.nodes[i].name}) {where}, while the other nodes' {key} are: "
                f"{said}: a typo? If the node really is on another routed network, add that network to "
                "fabric.private_networks")
    return warnings


def address_rules(config: StackConfig, result: Validation) -> None:
    """Addresses the nodes use to reach each other must be able to: no loopback across nodes, one address family
    for the control plane, and vLLM's bind one of the head's own addresses (or all, or loopback)."""
    multi = len(config.nodes) > 1
    for i, node in enumerate(config.nodes):
        for key, address in _node_addresses(node):
            if multi and ipaddress.ip_address(address).is_loopback:
                result.problems.append(Problem(f"nodes.{i}.{key}", address, "is a loopback address: the other nodes "
                                               "cannot reach this node there", fix="the node's address on the network "
                                               "between the nodes"))
    result.warnings += _stray_address_warnings(config)
    controls = [(i, ip, ipaddress.ip_address(ip).version)
                for i, ip in ((i, control_ip(config, n)) for i, n in enumerate(config.nodes)) if ip]
    mixed = [(i, ip) for i, ip, version in controls if version != controls[0][2]]
    if mixed:
        i, ip = mixed[0]
        result.problems.append(Problem(
            f"nodes.{i}.{'management_ip' if config.fabric.control_plane == 'management' else 'data_ips.0'}", ip,
            "the control plane mixes IPv4 and IPv6: NCCL, Gloo, the DP handshake and Ray connect within one family",
            fix="the same address family on every node"))
    bind, head = config.serving.host, config.head
    own = {head.management_ip, *head.data_ips}
    if bind not in WILDCARDS and not is_loopback(bind) and bind not in own:
        result.problems.append(Problem(
            "serving.host", bind, f"is not an address of the head {head.name}: vLLM could not bind it",
            fix=f"0.0.0.0 (all, behind the firewall), 127.0.0.1 (behind the proxy) or one of {', '.join(sorted(own))}"))
    proxy = config.api.proxy
    if proxy.enabled and proxy.bind not in WILDCARDS and not is_loopback(proxy.bind) and proxy.bind not in own:
        result.problems.append(Problem(
            "api.proxy.bind", proxy.bind, f"is not an address of the head {head.name}: nginx could not bind it",
            fix=f"0.0.0.0, or one of {', '.join(sorted(own))}"))
    target = config.api.public_host or (proxy.server_name if proxy.enabled else None) or head.management_ip
    listen = proxy.bind if proxy.enabled else bind
    if listen == "0.0.0.0" and is_ip_literal(target) and ipaddress.ip_address(target).version == 6:
        result.problems.append(Problem(
            "api.proxy.bind" if proxy.enabled else "serving.host", listen,
            f"binds IPv4 only, but clients and the API checks call the IPv6 address {target}",
            fix="'::' (all addresses, IPv6 and IPv4 on Linux)"))


def port_rules(config: StackConfig, result: Validation) -> None:
    """Every port bound on the head is distinct, and none is the head's sshd port (host networking)."""
    ports = {"serving.port": config.serving.port}
    if config.api.proxy.enabled:
        ports["api.proxy.port"] = config.api.proxy.port
    dp = config.parallelism.backend == "mp" and config.parallelism.data > 1
    if dp:
        ports["parallelism.data_parallel_rpc_port"] = config.parallelism.data_parallel_rpc_port
    if config.parallelism.backend == "ray":
        ports |= {"ray.gcs_port": config.ray.gcs_port, "ray.dashboard_port": config.ray.dashboard_port,
                  "ray.client_port": config.ray.client_port}
    if len(config.nodes) > 1:  # the collective check's rendezvous store (checks/collective.py) on the head
        ports["fabric.collective_port"] = config.fabric.collective_port
    seen: dict[int, str] = {config.head.ssh.port: "nodes.0.ssh.port (the head's sshd)"}
    for key, port in ports.items():
        if port in seen:
            result.problems.append(Problem(key, port, f"same port as {seen[port]}: one would fail to bind "
                                           "(OSError: [Errno 98] Address already in use)", fix="a distinct port"))
        seen.setdefault(port, key)
    if replica_spans_nodes(config):
        _master_port_rules(config, result, seen)


def _master_port_rules(config: StackConfig, result: Validation, seen: dict[int, str]) -> None:
    """`--master-port` is bound by global rank 0's TCPStore on the head (vllm/distributed/parallel_state.py:
    1875-1877): distinct from every other port bound there (in the kernel's ephemeral range it is warned with every
    other chosen port: `listeners.ephemeral_port_warnings`). vLLM's DP
    process-group port is no clash: with DP > 1, 0.33.0 replaces it with free ports (config/parallel.py:998-1014)."""
    port = config.parallelism.master_port
    if port in seen:
        result.problems.append(Problem("parallelism.master_port", port, f"same port as {seen[port]}: one would fail "
                                       "to bind (OSError: [Errno 98] Address already in use)", fix="a distinct port"))


LOOPBACK = ("127.0.0.1", "::1")


def proxy_rules(config: StackConfig, result: Validation) -> None:
    """With the proxy on, vLLM must be reachable only through it, and every secret it needs must exist."""
    proxy = config.api.proxy
    if not proxy.enabled:
        if config.serving.host not in LOOPBACK and config.api_key is None:
            result.warnings.append(
                f"serving.host {config.serving.host} exposes vLLM without a key: every path, /v1 included, "
                "is open to the private networks; set api_key (a secret) or turn on api.proxy")
        elif config.serving.host in LOOPBACK:
            result.warnings.append(
                f"serving.host {config.serving.host} with api.proxy off: vLLM answers only processes on "
                f"{config.head.name}; the API checks run there (docker exec in the engine container, over SSH), "
                "and clients need api.proxy (or an SSH tunnel)")
        return
    problems, warnings = routes_problems(config)
    result.problems += problems
    result.warnings += warnings
    if config.serving.host not in LOOPBACK:
        result.problems.append(Problem(
            "serving.host", config.serving.host, "with api.proxy.enabled vLLM must listen where only the proxy "
            "reaches it; on this address clients could go around the allowlist and the keys",
            fix="127.0.0.1 (the proxy shares the head's host network)"))
    if config.api_key is None:
        result.problems.append(Problem(
            "api_key", None, "the proxy forwards with vLLM's own key and vLLM must still refuse anyone else",
            fix="pulumi config set --secret vllm-cluster:api_key \"$(openssl rand -hex 32)\""))
    if not config.proxy_keys:
        result.problems.append(Problem(
            "proxy_keys", None, "the proxy has no client keys: every request would be refused with 401",
            fix=f"pulumi config set --secret --path 'vllm-cluster:proxy_keys.{proxy.check_client or '<client>'}' "
                "\"$(openssl rand -hex 32)\""))
    elif proxy.check_client is not None and proxy.check_client not in config.proxy_keys:
        result.problems.append(Problem("api.proxy.check_client", proxy.check_client, "no such client in proxy_keys",
                                       fix=f"one of {sorted(config.proxy_keys)}"))
    if proxy.tls:
        for key, pem in (("tls_certificate", "server.crt"), ("tls_private_key", "server.key")):
            if getattr(config, key) is None:
                result.problems.append(Problem(
                    key, None, "api.proxy.tls is on but the secret is not set",
                    fix=f"pulumi config set --secret vllm-cluster:{key} < {pem} "
                        "(PEM), or api.proxy.tls: false on a trusted network"))
    else:
        result.warnings.append("api.proxy.tls is off: bearer keys and prompts cross the network in clear text" + (
            " (on port 80, the default without TLS; set api.proxy.port for another, e.g. 443 where clients call "
            "that)" if proxy.port == 80 else ""))


def exposure_rules(config: StackConfig, result: Validation) -> None:
    """`stacks.planner.exposure`, the rule the policy pack applies too: no private network that is everything or
    unacknowledged public space, and vLLM's own port never reachable from outside them, whatever its key."""
    fabric = config.fabric
    findings = private_network_findings(fabric.private_networks, fabric.public_private_networks)
    result.problems += [Problem(f.key, f.value, f.message, fix=f.fix) for f in findings]
    if findings:
        return
    monitoring_exposure_rules(config, result)
    if config.api.proxy.enabled:  # with the proxy, proxy_rules keeps vLLM on loopback
        return
    serving = config.serving
    allowed = api_sources(config)
    trusted = collapse([*cluster_addresses(config), *fabric.private_networks])
    if api_exposed(serving.host, allowed, trusted, fabric.private_networks):
        result.problems.append(Problem("serving.host", serving.host,
                                       api_exposure_message(serving.host, serving.port, allowed),
                                       fix=API_EXPOSURE_FIX))


def unguarded_monitor_hosts(config: StackConfig) -> list[tuple[str, str, int]]:
    """(key, address, port) of each monitoring listener on a host that is no node (`observability.watch_address`,
    `supervisor_address` set to another host's address): no firewall of this stack guards it. The plan checks
    them, and the program hands them to the policy pack (PolicyFacts `unguardedMonitors`), which checks them the
    same way (`stacks.planner.exposure.unguarded_monitor_problem`)."""
    obs = config.observability
    if not obs.enabled:
        return []
    own = {ipaddress.ip_address(n.management_ip) for n in config.nodes}
    return [(f"observability.{key}", value, getattr(obs.ports, key.removesuffix("_address")))
            for key in ("watch_address", "supervisor_address")
            for value in [getattr(obs, key)] if value is not None and ipaddress.ip_address(value) not in own]


def monitoring_exposure_rules(config: StackConfig, result: Validation) -> None:
    """Rule 3 of `stacks.planner.exposure`: the unauthenticated monitoring endpoints stay inside the private
    networks. On a node, the test of vLLM's own port (`monitoring_exposed`) with the firewall's internal sources;
    on a host that is no node (`watch_address`, `supervisor_address`), no firewall of ours guards it, so its
    address must not be public space outside `fabric.private_networks`. The policy pack applies the same two
    functions to what the program registers (policy/rules.py `monitoring_exposure`)."""
    obs, fabric = config.observability, config.fabric
    if not obs.enabled:
        return
    for key, value, port in unguarded_monitor_hosts(config):
        problem = unguarded_monitor_problem(key, value, port, fabric.private_networks)
        if problem:
            result.problems.append(Problem(key, value, problem, fix=UNGUARDED_MONITOR_FIX))
    allowed = internal_sources(config)
    trusted = collapse([*cluster_addresses(config), *fabric.private_networks])
    exposed = [f"{n.name} ({n.management_ip})" for n in config.nodes
               if monitoring_exposed(n.management_ip, allowed, trusted, fabric.private_networks)]
    if exposed:
        result.problems.append(Problem("firewall.enabled", config.firewall.enabled,
                                       monitoring_exposure_message(exposed), fix=MONITORING_EXPOSURE_FIX))


def head_addresses(config: StackConfig) -> list[str]:
    """What names the head in this config: its SSH host, management and data addresses."""
    head = config.head
    return list(dict.fromkeys([head.ssh.host, head.management_ip, *head.data_ips]))


def endpoint_rules(config: StackConfig, result: Validation) -> None:
    """The API checks send a bearer key. With the proxy's TLS they trust only the stack's own certificate, so
    only the holder of tls_private_key receives it; without TLS nothing proves who answers, so the host they
    call must be one of the head's own addresses. And they must call where vLLM listens."""
    proxy, serving, api = config.api.proxy, config.serving, config.api
    own = head_addresses(config)
    if proxy.enabled:
        host, key = ((api.public_host, "api.public_host") if api.public_host
                     else (proxy.server_name, "api.proxy.server_name"))
    else:
        host, key = api.public_host, "api.public_host"
    sends_key = proxy.enabled or config.api_key is not None
    if host is not None and sends_key and not (proxy.enabled and proxy.tls) and host not in own:
        result.problems.append(Problem(
            key, host, "without TLS the API checks cannot tell the head from whoever answers at this name or "
            "address, and they would send it the bearer key",
            fix=(f"one of the head's own addresses ({', '.join(own)}), or api.proxy with tls: true (the checks then "
                 "trust only the stack's certificate)" if key == "api.public_host" else
                 "leave api.proxy.server_name unset (it takes host names only; the checks then call the head's "
                 f"address), or add api.public_host: one of the head's own addresses ({', '.join(own)}) for the "
                 "checks to call, or api.proxy with tls: true (the checks then trust only the stack's certificate)")))
    bind = serving.host
    if not proxy.enabled and api.public_host and bind not in WILDCARDS and not is_loopback(bind) \
            and api.public_host != bind and api.public_host in own:
        result.problems.append(Problem(
            "api.public_host", api.public_host, f"vLLM binds only {bind}; the API checks would call "
            f"{bracket_host(api.public_host)}:{serving.port}, where nothing listens, and wait until their deadline",
            fix=f"api.public_host: {bind} (or leave it unset), or serving.host: 0.0.0.0 behind the firewall"))


def host_key_rules(config: StackConfig, result: Validation) -> None:
    missing = [n.name for n in config.nodes if n.ssh.host_key is None]
    if missing:
        result.warnings.append(
            f"nodes[].ssh.host_key is not set for {', '.join(missing[:8])}{', ...' if len(missing) > 8 else ''}: "
            "the check commands and the Docker provider accept any host key there, so whoever sits on the path "
            "can answer PASS or receive the engines' secrets; set each from `ssh-keyscan -t ed25519 <host>` "
            "(checked against the console) - the prod policy refuses a stack without them")

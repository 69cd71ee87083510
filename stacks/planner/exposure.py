"""One exposure rule, shared by the plan (`stacks.planner.listeners`, `stacks.planner.validation`) and the policy
pack (`policy/`).

Stdlib only: the policy pack runs in its own virtualenv and imports this module from the repository.

1. vLLM's own API port must not be reachable from outside the private networks, whatever its key: vLLM's key
   guards only `/v1`-style paths (`vllm/entrypoints/openai/server_utils.py` `AuthenticationMiddleware`), so
   `/invocations`, `/tokenize`, `/pause`, `/collective_rpc`, … answer anyone who reaches the port. The proxy
   fronts it: vLLM then binds loopback and only the proxy's port faces clients. "Reachable" is the listener
   table's `public`: the socket's bind reaches past the private networks and the host firewall admits a source
   outside them and the cluster's own addresses.
2. `fabric.private_networks` decides who "the cluster" is for the firewall and the policy, so an entry that
   covers every address (a default route: `0.0.0.0/0`, or `0.0.0.0/1` + `128.0.0.0/1`) is always refused, and
   an entry in public address space is refused unless `fabric.public_private_networks` repeats it (seed 000's
   isolated RoCE fabric on 1.1.1.0/24 and 1.1.2.0/24 is such a case).
3. The monitoring endpoints (node and DCGM exporters, Prometheus, Alertmanager, the watch unit, the group
   supervisor) answer without authentication, Grafana with one password: the same test as rule 1 keeps them
   inside the private networks (`api_exposed` on each node's management address with the firewall's cluster
   sources), and `observability.watch_address` / `supervisor_address`, which may be hosts no firewall of ours
   guards, must not be public address space outside `fabric.private_networks` (`outside_private`).
"""

from __future__ import annotations

import ipaddress
import shlex
from collections.abc import Iterable
from dataclasses import dataclass

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

ANYWHERE = ("0.0.0.0/0", "::/0")
WILDCARDS = ("0.0.0.0", "::")
NON_PUBLIC: tuple[tuple[str, str], ...] = (
    ("10.0.0.0/8", "RFC 1918"), ("172.16.0.0/12", "RFC 1918"), ("192.168.0.0/16", "RFC 1918"),
    ("127.0.0.0/8", "loopback"), ("169.254.0.0/16", "link-local"), ("100.64.0.0/10", "CGNAT, RFC 6598"),
    ("192.0.2.0/24", "documentation, RFC 5737"), ("198.51.100.0/24", "documentation, RFC 5737"),
    ("203.0.113.0/24", "documentation, RFC 5737"), ("198.18.0.0/15", "benchmarking, RFC 2544"),
    ("fc00::/7", "ULA, RFC 4193"), ("::1/128", "loopback"), ("fe80::/10", "link-local"),
    ("2001:db8::/32", "documentation, RFC 3849"),
)
"""Ranges that are never routed on the internet: declaring them private needs no acknowledgement."""
_NON_PUBLIC = [ipaddress.ip_network(c) for c, _ in NON_PUBLIC]

API_PATHS_OPEN_WITH_KEY = "/invocations, /tokenize, /pause, /collective_rpc, /metrics"
"""Paths vLLM serves without checking its key (they are not under /v1)."""


def network(cidr: str) -> IpNetwork:
    return ipaddress.ip_network(cidr, strict=False)


def is_public_space(net: IpNetwork) -> bool:
    """True when some address of `net` lies outside every never-routed range."""
    return not any(net.version == n.version and net.subnet_of(n) for n in _NON_PUBLIC)  # type: ignore[arg-type]


def covers_everything(cidrs: Iterable[str]) -> bool:
    """The entries together hold every IPv4 or every IPv6 address (a default route, however it is split)."""
    nets = [network(c) for c in cidrs]
    for version, everything in ((4, "0.0.0.0/0"), (6, "::/0")):
        merged = list(ipaddress.collapse_addresses(n for n in nets if n.version == version))  # type: ignore[type-var]
        if merged and str(merged[0]) == everything:
            return True
    return False


@dataclass(frozen=True)
class NetworkFinding:
    """A refused `fabric.private_networks` / `fabric.public_private_networks` entry."""

    key: str
    value: str
    message: str
    fix: str


def private_network_findings(private: list[str], acknowledged: list[str]) -> list[NetworkFinding]:
    """Rule 2: every-address entries always refused; public space only where acknowledged."""
    out: list[NetworkFinding] = []
    known = {str(network(c)) for c in private}
    for i, cidr in enumerate(private):
        net = network(cidr)
        key = f"fabric.private_networks.{i}"
        if net.prefixlen == 0:
            out.append(NetworkFinding(key, cidr, "covers every address (a default route): the firewall would let "
                                      "anyone reach the unauthenticated internal ports, and the policy would call "
                                      "every address private", "the networks the nodes really share, e.g. "
                                      "10.30.8.0/24; a public range only with fabric.public_private_networks"))
        elif is_public_space(net) and str(net) not in {str(network(a)) for a in acknowledged}:
            out.append(NetworkFinding(key, cidr, "is public address space (not RFC 1918, ULA, loopback, link-local, "
                                      "CGNAT or documentation): it is private only if this site isolates it",
                                      f"if it is isolated here (a RoCE fabric, say), repeat it in "
                                      f"fabric.public_private_networks: [{cidr}]; otherwise remove it"))
    if private and covers_everything(private) and not any(network(c).prefixlen == 0 for c in private):
        out.append(NetworkFinding("fabric.private_networks", ", ".join(private), "together covers every address "
                                  "(a default route split into parts)", "the networks the nodes really share"))
    for j, cidr in enumerate(acknowledged):
        key = f"fabric.public_private_networks.{j}"
        if str(network(cidr)) not in known:
            out.append(NetworkFinding(key, cidr, "is not an entry of fabric.private_networks",
                                      "list it in both, or remove it here"))
        elif not is_public_space(network(cidr)):
            out.append(NetworkFinding(key, cidr, "is not public address space: it needs no acknowledgement",
                                      "remove it here (keep it in fabric.private_networks)"))
        elif network(cidr).prefixlen < MIN_ACK_PREFIX[network(cidr).version]:
            net = network(cidr)
            out.append(NetworkFinding(key, cidr, f"acknowledges {net.num_addresses:,} public addresses as the "
                                      "cluster's: the firewall would admit all of them to Ray, the TCPStores and "
                                      "vLLM's port; an isolated fabric is a few subnets",
                                      f"the fabric's own subnets, each /{MIN_ACK_PREFIX[net.version]} or narrower"))
    return out


MIN_ACK_PREFIX = {4: 16, 6: 48}
"""The widest public range `fabric.public_private_networks` may acknowledge (a /16, a /48)."""


def trusted_networks(private: list[str]) -> list[str]:
    """Declared networks the policy may believe: none at all when they cover every address."""
    return [] if covers_everything(private) else list(private)


def is_loopback(bind: str) -> bool:
    return bind not in WILDCARDS and ipaddress.ip_address(bind).is_loopback


def bind_reachable(bind: str, private: list[str]) -> bool:
    """A wildcard bind is reachable on every interface; a specific one only where that address is routed:
    not from outside when it lies inside a private network (loopback never)."""
    if bind in WILDCARDS:
        return True
    address = ipaddress.ip_address(bind)
    if address.is_loopback:
        return False
    return not any(address in network(c) for c in private)


def admits_outside(allowed: list[str], trusted: list[str]) -> bool:
    """True when the firewall admits some address outside `trusted` (private networks and cluster addresses).
    `allowed` is usually `trusted` itself (or built from it): checked as strings first, as networks only when not."""
    known = set(trusted)
    rest = [network(c) for c in allowed if c not in known]
    if not rest:
        return False
    nets = [network(c) for c in trusted]
    return any(not any(n.version == t.version and n.subnet_of(t) for t in nets) for n in rest)  # type: ignore[arg-type]


def api_exposed(bind: str, allowed: list[str], trusted: list[str], private: list[str]) -> bool:
    """Rule 1: vLLM's API socket on `bind`, behind a firewall admitting `allowed`, is reachable from outside."""
    return not is_loopback(bind) and admits_outside(allowed, trusted) and bind_reachable(bind, private)


def api_exposure_message(bind: str, port: int, allowed: list[str]) -> str:
    admits = "any address" if set(ANYWHERE) & set(allowed) else ", ".join(allowed[:6])
    return (f"vLLM's own API port {port} on {bind} is reachable from outside the private networks (the host "
            f"firewall admits {admits}); its key guards only /v1 paths, so {API_PATHS_OPEN_WITH_KEY} and more "
            "answer anyone there, whatever api_key says")


API_EXPOSURE_FIX = ("turn on api.proxy (vLLM then binds 127.0.0.1 behind nginx's allowlist), or let only private "
                    "networks reach it (firewall.enabled: true and firewall.api_sources inside "
                    "fabric.private_networks), or bind serving.host to an address inside fabric.private_networks")


def outside_private(address: str, private: list[str]) -> bool:
    """Rule 3 for a host we do not firewall: `address` is public address space and in no declared private
    network (loopback, RFC 1918, ULA and the other never-routed ranges are private by nature)."""
    ip = ipaddress.ip_address(address)
    return is_public_space(network(address)) and not any(ip in network(c) for c in private)


def monitoring_exposure_message(exposed: list[str]) -> str:
    shown = ", ".join(exposed[:6]) + (", ..." if len(exposed) > 6 else "")
    return (f"the monitoring listeners on {shown} are reachable from outside the private networks (the host "
            "firewall is off and these management addresses lie outside fabric.private_networks): the exporters, "
            "Prometheus, Alertmanager, the watch unit and the group supervisor answer anyone without "
            "authentication, like vLLM's own port")


def monitoring_exposed(bind: str, allowed: list[str], trusted: list[str], private: list[str]) -> bool:
    """Rule 3 on a node: a monitoring listener on `bind`, behind a firewall admitting `allowed` to its port, is
    reachable from outside the private networks: the test of vLLM's own port (rule 1), since none of these
    endpoints authenticates more than vLLM's paths outside /v1 do. The plan asks it of each node's management
    address; the policy pack of each monitoring container's listen address and its node's firewall."""
    return api_exposed(bind, allowed, trusted, private)


WATCH_OR_SUPERVISOR = {"observability.watch_address": "watch unit", "observability.supervisor_address":
                       "group supervisor"}


def unguarded_monitor_problem(key: str, address: str, port: int, private: list[str]) -> str | None:
    """Rule 3 on a host that is no node (`observability.watch_address` / `supervisor_address`): no firewall of the
    stack guards it, so a public address outside `private` is refused; the message, or None."""
    if not outside_private(address, private):
        return None
    host = f"[{address}]" if ":" in address else address
    return (f"is public address space outside fabric.private_networks: the {WATCH_OR_SUPERVISOR.get(key, key)} serves "
            f"its metrics on {host}:{port} without authentication, on a host no firewall of this stack guards")


UNGUARDED_MONITOR_FIX = ("an address of that host inside fabric.private_networks (or a never-routed range: RFC "
                         "1918, ULA), or leave it unset to run it on the monitoring node")


MONITORING_EXPOSURE_FIX = ("firewall.enabled: true (it admits only the cluster and the private networks to the "
                           "monitoring ports), or, if the management network is isolated, list it in "
                           "fabric.private_networks, or observability.enabled: false")


# --- what the host firewall really applies, read back from its command (for the policy pack) -----------------

NFT_MARKER = "VLLM_CLUSTER_NFT"


def firewall_file(command: str) -> str | None:
    """The nft file inside a `stacks.planner.firewall` apply command (`[sudo -n] timeout N sh -c '<script>'`)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    script = words[-1] if words else ""
    head = f"<<'{NFT_MARKER}'\n"
    if head not in script:
        return None
    body = script.split(head, 1)[1]
    return body.split(f"{NFT_MARKER}\n", 1)[0] if f"{NFT_MARKER}\n" in body else None


def nft_sets(text: str) -> dict[str, list[str]]:
    """Set name -> elements of the `set NAME { … elements = { a, b } }` blocks of a rendered table."""
    sets: dict[str, list[str]] = {}
    current: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("set ") and line.endswith("{"):
            current = line.split()[1]
            sets[current] = []
        elif current and line.startswith("elements = {"):
            sets[current] = [e.strip() for e in line.split("{", 1)[1].rsplit("}", 1)[0].split(",") if e.strip()]
        elif line == "}":
            current = None
    return sets


def _ports(elements: list[str]) -> list[tuple[int, int]]:
    out = []
    for e in elements:
        low, _, high = e.partition("-")
        out.append((int(low), int(high or low)))
    return out


def sources_for_port(sets: dict[str, list[str]] | None, port: int) -> tuple[list[str], list[str]]:
    """(who the firewall admits to `port`, the cluster's sources) from a node's table; anywhere without one."""
    if sets is None:
        return list(ANYWHERE), []
    cluster = sets.get("internal_v4", []) + sets.get("internal_v6", [])
    for label in ("api", "internal"):
        if any(low <= port <= high for low, high in _ports(sets.get(f"{label}_ports", []))):
            return sets.get(f"{label}_v4", []) + sets.get(f"{label}_v6", []), cluster
    return list(ANYWHERE), cluster

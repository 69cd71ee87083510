"""Taking one replica group out of the front door and putting it back: the mechanism of a rolling change.

A rolling change replaces independent replica groups one at a time behind the nginx front door, so the endpoint
keeps serving with N-1 of N groups. For each group in turn: drain, replace its containers, check it through its own
API, undrain.

The drain works below nginx, at the front door host's firewall, and never reloads nginx: a reload makes the old
nginx workers close every idle client keep-alive connection, and a client that sends its next request on one at
that moment gets no answer (bench/rolling_change.py measured it: 1 failed request in 1,546 over four reloads). So:

- the front door opens a new connection to the engines for every request when a stack has groups (no upstream
  `keepalive`, stacks/planner/proxy.py), so no idle connection to a group outlives its last request;
- drain: an nftables rule on the front door's host refuses *new* connections from non-root processes to the group's
  API servers (`meta skuid != 0`, `ct state new`, TCP reset): nginx's workers never run as root, while the group's
  own check (`docker exec` into its engine, as root) still reaches it on the same address. nginx then passes each
  new request to the next server: a refused connection has sent nothing, which nginx retries even for POST
  (`proxy_next_upstream error`, default; nginx docs: a non-idempotent request is not passed on only "if a request
  has been sent to an upstream server"). Requests already running keep their connections; the drain waits, at
  most `bound_s`, until no established connection to the group is left (`ss`);
- undrain: the rule is deleted; then it waits out nginx's `fail_timeout` (the refused connections marked the
  group's servers unavailable for that long): draining the next group before that would leave nginx no server.

The rules live in a table of their own (`inet vllm_cluster_drain`), apart from the host firewall's, and carry the
group's name in a comment, so undrain deletes exactly the group's rules. A drain of a group that is still drained
(a change stopped in its turn: its check failed, its engine did not start; this is the next `pulumi up`) makes its
rules anew for this change's servers before it deletes the old ones, so the group never takes requests meanwhile.
Scripts are POSIX sh with `nft`, `ss`, `grep` and `sed`; they carry no secret.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Sequence

GROUP_NAME = re.compile(r"[a-z][a-z0-9-]{0,31}")
DRAIN_TABLE = "vllm_cluster_drain"
FAIL_TIMEOUT_S = 10
"""nginx's `fail_timeout` on a group's servers (written out in nginx.conf; nginx's default too): a drained group's
refused connections mark its servers unavailable for this long, so the next group may be drained only after it
(undrain waits it out)."""
DRAIN_BOUND_S = 600
"""How long a drain waits at most for the requests the group still serves: streamed answers of a long context
can run for minutes. Past it the change goes on and says how many connections were still open."""


def check_group_name(name: str) -> str:
    """A group name as it appears in rule comments, resource names and patterns: lowercase letters, digits, `-`."""
    if not isinstance(name, str) or not GROUP_NAME.fullmatch(name):
        raise ValueError(f"group name {str(name)[:40]!r}: use 1-32 lowercase letters, digits and '-', starting "
                         "with a letter, e.g. a or replica-1")
    return name


def _servers(servers: Sequence[tuple[str, int]]) -> list[tuple[str, str, int]]:
    """(nft family keyword, canonical address, port) per API server; refuses what is not an IP literal and port."""
    out = []
    if not servers:
        raise ValueError("a group needs at least one API server")
    for host, port in servers:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"API server {str(host)[:60]!r}: not an IP address") from None
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError(f"API server port {port!r}: 1-65535")
        out.append(("ip" if address.version == 4 else "ip6", str(address), port))
    return out


def _comment(group: str) -> str:
    return f"vllm-cluster group:{check_group_name(group)}"


def drain_script(group: str, servers: Sequence[tuple[str, int]], bound_s: int = DRAIN_BOUND_S) -> str:
    """Refuse new connections to the group's API servers, then wait (at most `bound_s`) until the connections of
    the requests it was serving have closed."""
    if isinstance(bound_s, bool) or not isinstance(bound_s, int) or not 1 <= bound_s <= 86_400:
        raise ValueError(f"drain bound {bound_s!r}: 1-86400 seconds")
    comment = _comment(group)
    table = f"inet {DRAIN_TABLE}"
    listed = shlex.quote(f'comment "{comment}"')  # how `nft list` prints the rule's comment
    again = (f"drain {group}: was still out of the upstreams (an earlier change stopped in its turn); its rules are "
             "made anew")
    lines = [
        "set -u",
        # still drained: a change stopped in this group's turn (its check failed, its engine did not start) and this
        # is the next `pulumi up`. Its rules are made anew for this change's servers, then the old ones deleted
        f"old=$(nft -a list chain {table} output 2>/dev/null | grep -F {listed} "
        "| sed -n 's/.*# handle \\([0-9][0-9]*\\)$/\\1/p')",
        f"[ -z \"$old\" ] || echo {shlex.quote(again)}",
        f"nft add table {table} && nft add chain {table} output '{{ type filter hook output priority 0; }}' || "
        f"{{ echo {shlex.quote(f'drain {group}: nft could not make table {table}')}; exit 1; }}",
    ]
    quoted = f'"{comment}"'
    for family, address, port in _servers(servers):
        lines.append(f"nft add rule {table} output meta skuid != 0 {family} daddr {address} tcp dport {port} "
                     f"ct state new reject with tcp reset comment {shlex.quote(quoted)} || "
                     f"{{ echo {shlex.quote(f'drain {group}: nft refused the rule for {address} port {port}')}; "
                     "exit 1; }")
    query = _query(servers)
    lines += [
        f"for h in $old; do nft delete rule {table} output handle \"$h\" || exit 1; done",
        f"deadline=$(( $(date +%s) + {bound_s} ))",
        f"while open=$(ss -Htn state established {shlex.quote(query)} | wc -l); [ \"$open\" -gt 0 ]; do",
        f'  [ "$(date +%s)" -ge "$deadline" ] && {{ echo "drain {group}: $open connection(s) still open after '
        f'{bound_s} s; going on"; exit 0; }}',
        "  sleep 0.2; done",
        f"echo {shlex.quote(f'drain {group}: out of the upstreams, no request left in flight')}",
    ]
    return "\n".join(lines) + "\n"


def _query(servers: Sequence[tuple[str, int]]) -> str:
    """An `ss` filter for connections to any of the servers."""
    return " or ".join(f"( dst {f'[{a}]' if fam == 'ip6' else a}:{port} )" for fam, a, port in _servers(servers))


def undrain_script(group: str, servers: Sequence[tuple[str, int]], settle_s: int = FAIL_TIMEOUT_S + 1) -> str:
    """Delete the group's drain rules, then wait `settle_s`: nginx's `fail_timeout` for the connections the drain
    refused, after which nginx counts the group's servers available again. Not until a connection to the group is
    seen: on the front door's own host the engine's Docker healthcheck connects too, and an undrain that returned
    on it let the next group be drained while nginx still held this one down (19 of 35,069 requests answered 503
    in a lab run). `servers` are checked as the drain checks them."""
    _servers(servers)
    listed = shlex.quote(f'comment "{_comment(group)}"')
    table = f"inet {DRAIN_TABLE}"
    if isinstance(settle_s, bool) or not isinstance(settle_s, int) or not 0 <= settle_s <= 3600:
        raise ValueError(f"undrain settle {settle_s!r}: 0-3600 seconds")
    return "\n".join([
        "set -u",
        f"handles=$(nft -a list chain {table} output 2>/dev/null | grep -F {listed} "
        "| sed -n 's/.*# handle \\([0-9][0-9]*\\)$/\\1/p')",
        f"[ -n \"$handles\" ] || {{ echo {shlex.quote(f'undrain {group}: it was not drained')}; exit 3; }}",
        f"for h in $handles; do nft delete rule {table} output handle \"$h\" || exit 1; done",
        # the last group back: no table of ours left behind (a destroy leaves the node as it found it)
        f"nft list table {table} | grep -qF 'comment \"vllm-cluster group:' || nft delete table {table}",
        f"sleep {settle_s}",
        f"echo {shlex.quote(f'undrain {group}: back in the upstreams (after nginx fail_timeout, {settle_s} s)')}",
    ]) + "\n"

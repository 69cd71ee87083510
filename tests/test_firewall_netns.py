"""The host firewall applied for real: nftables in network namespaces with a head, a peer and an outsider.

The head runs listeners bound to every address exactly as the listener table says the real ones are (a
Ray-GCS-like gRPC port, two real torch TCPStores — one on an OS-picked port, one on `--master-port` 29500 —,
the API port, an SSH-like port 22 and a port nobody declared). The ruleset is the one the program would apply,
run through the very command string of the Pulumi resource. The peer must get through, the outsider must not,
SSH and undeclared ports must stay as they were, and removing the table must restore the ruleset byte for byte,
with Docker's tables and an operator's table present and untouched.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stacks.model.config import StackConfig
from stacks.planner.firewall import NodeFirewall, apply_file, firewall_command
from stacks.planner.plan import build_plan
from tests.netns_firewall import Lab, lab_config, listeners, stop

# Docker 20.10's tables as iptables-nft lists them on this machine (counters left out, so the before/after
# comparison can be byte for byte), plus a published port's DNAT.
DOCKER = """table ip nat {
\tchain DOCKER {
\t\tiifname "docker0" return
\t\tiifname != "docker0" tcp dport 8080 dnat to 172.17.0.2:80
\t}

\tchain POSTROUTING {
\t\ttype nat hook postrouting priority srcnat; policy accept;
\t\toifname != "docker0" ip saddr 172.17.0.0/16 masquerade
\t}

\tchain PREROUTING {
\t\ttype nat hook prerouting priority dstnat; policy accept;
\t\tfib daddr type local jump DOCKER
\t}

\tchain OUTPUT {
\t\ttype nat hook output priority -100; policy accept;
\t\tip daddr != 127.0.0.0/8 fib daddr type local jump DOCKER
\t}
}
table ip filter {
\tchain DOCKER {
\t}

\tchain DOCKER-ISOLATION-STAGE-1 {
\t\tiifname "docker0" oifname != "docker0" jump DOCKER-ISOLATION-STAGE-2
\t\treturn
\t}

\tchain DOCKER-ISOLATION-STAGE-2 {
\t\toifname "docker0" drop
\t\treturn
\t}

\tchain FORWARD {
\t\ttype filter hook forward priority filter; policy drop;
\t\tjump DOCKER-USER
\t\tjump DOCKER-ISOLATION-STAGE-1
\t\toifname "docker0" ct state related,established accept
\t\toifname "docker0" jump DOCKER
\t\tiifname "docker0" oifname != "docker0" accept
\t\tiifname "docker0" oifname "docker0" accept
\t}

\tchain DOCKER-USER {
\t\treturn
\t}

\tchain INPUT {
\t\ttype filter hook input priority filter; policy accept;
\t\taccept
\t}
}
"""

# An operator's own table: an earlier-priority accept of the GCS port from anywhere (ours must still drop it:
# an accept is not final across base chains) and a drop of port 9100 (ours must not undo it).
OPERATOR = """table inet operator {
\tset admins {
\t\ttype ipv4_addr
\t\tflags interval
\t\telements = { 192.0.2.0/24 }
\t}

\tchain input {
\t\ttype filter hook input priority -10; policy accept;
\t\ttcp dport 6379 accept
\t\ttcp dport 9100 ip saddr != @admins drop
\t}
}
"""

STORE = """
import json, sys, threading
from datetime import timedelta
from torch.distributed import TCPStore
host = sys.argv[1]
a = TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
b = TCPStore(host, 29500, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
print(json.dumps({"store_ephemeral": a.port, "store_master": b.port}), flush=True)
threading.Event().wait()
"""


def head_firewall(config: StackConfig) -> NodeFirewall:
    """The head's rules from the plan's own listener table."""
    return build_plan("lab", config).firewall.nodes[0]


def run_command(lab: Lab, role: str, command: str) -> subprocess.CompletedProcess[str]:
    """The resource's command string, run by a shell on the 'node' as the SSH session would."""
    return lab.run(role, ["sh", "-c", command], check=False, timeout=180)


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with Lab() as lab:
        yield lab


@pytest.fixture(scope="module")
def ports(lab: Lab) -> Iterator[dict[str, int]]:
    """Listeners in the head: plain sockets bound like the real ones, and two real torch TCPStores."""
    specs = [("gcs", "::", 6379), ("api", "0.0.0.0", 8000), ("api_mp", "0.0.0.0", 8030), ("ssh", "::", 22),
             ("other", "::", 9100)]
    store = subprocess.Popen(["ip", "netns", "exec", lab.ns("head"), sys.executable, "-c", STORE, lab.v4("head")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lab.procs.append(store)
    assert store.stdout is not None
    line = store.stdout.readline()
    assert line, store.stderr.read() if store.stderr else "TCPStore process died"
    with listeners(lab, "head", specs) as plain:
        yield {**plain, **json.loads(line)}
    stop(store, 2)


def reach(lab: Lab, role: str, port: int, *, v6: bool = False) -> str:
    return lab.connect(role, lab.v6("head") if v6 else lab.v4("head"), port)


def test_tcpstores_bind_every_address_as_the_table_says(lab: Lab, ports: dict[str, int]) -> None:
    seen = {(addr, port) for addr, port, _ in lab.listening("head")}
    low, high = lab_config(lab).firewall.ephemeral_ports
    assert low <= ports["store_ephemeral"] <= high
    # host_name was the head's IPv4 address; the servers still listen on [::] (ss prints `*`).
    assert ("*", ports["store_ephemeral"]) in seen and ("*", 29500) in seen


def test_before_the_firewall_the_outsider_reaches_everything(lab: Lab, ports: dict[str, int]) -> None:
    """Control: without the table, what the listener table calls 'all' really is reachable from the LAN."""
    assert lab.ruleset("head") == ""
    for port in (6379, ports["store_ephemeral"], 29500, 8000):
        assert reach(lab, "out", port) == "ok"
    assert reach(lab, "out", 6379, v6=True) == "ok"


@pytest.mark.parametrize("stack,fixed,api", [("h20", 6379, 8000), ("h20-mp", 29500, 8000)])
def test_applied_table_admits_the_cluster_and_drops_the_outsider(lab: Lab, ports: dict[str, int], tmp_path: Path,
                                                                 stack: str, fixed: int, api: int) -> None:
    config = lab_config(lab, stack)
    spec = head_firewall(config)
    assert str(fixed) in ",".join(spec.internal_ports) and spec.api_ports == [str(api)]
    before = lab.ruleset("head")
    command = firewall_command(spec, config.nodes[0], state_dir=str(tmp_path / "etc"), unit_dir=str(tmp_path))
    applied = run_command(lab, "head", command.create)
    assert applied.returncode == 0 and "PASS firewall-head" in applied.stdout, applied.stdout + applied.stderr
    assert "no systemd" in applied.stdout                       # the lab has none: said, not hidden
    assert (tmp_path / "etc/firewall.nft").read_text() == apply_file(spec)
    t0 = time.monotonic()
    for port in (fixed, ports["store_ephemeral"], api):
        assert reach(lab, "peer", port) == "ok", port
        assert reach(lab, "out", port) == "timeout", port
    assert reach(lab, "peer", fixed, v6=True) == "ok"            # the peer's IPv6 data address is in the set
    assert reach(lab, "out", fixed, v6=True) == "timeout"
    assert reach(lab, "out", ports["store_ephemeral"], v6=True) == "timeout"
    for port in (22, 9100):                                      # not in the table: exactly as before
        assert reach(lab, "out", port) == "ok" and reach(lab, "out", port, v6=True) == "ok"
    assert lab.connect("head", "127.0.0.1", fixed) == "ok"       # local clients
    with listeners(lab, "out", [("svc", "0.0.0.0", 0)]) as outside:  # the head's own outgoing connections
        assert lab.connect("head", lab.v4("out"), outside["svc"]) == "ok"
    print(f"connect checks with the table applied: {time.monotonic() - t0:.1f}s")
    counters = lab.run("head", ["nft", "list", "chain", "inet", "vllm_cluster", "input"]).stdout
    assert "counter packets 0" not in counters.split("internal port")[0].splitlines()[-1]

    again = run_command(lab, "head", command.update)              # idempotent: same table, applied again
    assert again.returncode == 0
    assert lab.run("head", ["nft", "list", "tables"]).stdout.strip() == "table inet vllm_cluster"

    removed = run_command(lab, "head", command.delete)
    assert removed.returncode == 0 and "removed" in removed.stdout
    assert lab.ruleset("head") == before                         # byte for byte
    assert not (tmp_path / "etc").exists()
    assert reach(lab, "out", fixed) == "ok"
    assert run_command(lab, "head", command.delete).returncode == 0   # destroy twice: nothing to do, no error


def test_api_port_follows_its_configured_sources(lab: Lab, ports: dict[str, int], tmp_path: Path) -> None:
    config = lab_config(lab, front_door=True, api_sources=[f"{lab.v4('out')}/32"])
    command = firewall_command(head_firewall(config), config.nodes[0], state_dir=str(tmp_path), unit_dir=str(tmp_path))
    try:
        assert run_command(lab, "head", command.create).returncode == 0
        assert reach(lab, "out", 8000) == "ok"
        assert reach(lab, "out", 8000, v6=True) == "timeout"       # only that IPv4 address was listed
        assert reach(lab, "peer", 8000) == "timeout"               # the API list is the API list: peers too
        assert reach(lab, "out", 6379) == "timeout"                # internal ports unchanged
        anywhere = lab_config(lab, front_door=True, api_sources=["0.0.0.0/0", "::/0"])
        update = firewall_command(head_firewall(anywhere), anywhere.nodes[0], state_dir=str(tmp_path),
                                  unit_dir=str(tmp_path))
        assert update.ruleset_sha256 != command.ruleset_sha256
        assert run_command(lab, "head", update.update).returncode == 0
        assert reach(lab, "peer", 8000) == "ok"
        assert reach(lab, "out", 8000, v6=True) == "refused"          # let through; the listener is IPv4 only
        assert reach(lab, "out", 6379) == "timeout"
        # A hand-edited rules file is still this node's: the delete removes what the update applied.
        run_command(lab, "head", f"echo '# edited' >> {tmp_path}/firewall.nft")
    finally:
        removed = run_command(lab, "head", command.delete)
        assert removed.returncode == 0 and "removed" in removed.stdout, removed.stdout + removed.stderr
        assert "vllm_cluster" not in lab.run("head", ["nft", "list", "tables"]).stdout


def test_a_renamed_nodes_old_resource_leaves_the_new_table(lab: Lab, tmp_path: Path) -> None:
    """A node renamed in the stack on the same host: Pulumi creates the new name's firewall, then deletes the old
    name's. That delete finds the file naming the new node and leaves the table, its unit and file in place."""
    config = lab_config(lab, "h20")
    spec = head_firewall(config)
    old = firewall_command(spec.model_copy(update={"node": "head-old"}), config.nodes[0], state_dir=str(tmp_path),
                           unit_dir=str(tmp_path))
    new = firewall_command(spec, config.nodes[0], state_dir=str(tmp_path), unit_dir=str(tmp_path))
    try:
        assert run_command(lab, "head", new.create).returncode == 0
        stale = run_command(lab, "head", old.delete)
        assert stale.returncode == 0 and "LEFT IN PLACE" in stale.stdout, stale.stdout + stale.stderr
        assert "table inet vllm_cluster" in lab.run("head", ["nft", "list", "tables"]).stdout
        assert (tmp_path / "firewall.nft").exists()
    finally:
        assert run_command(lab, "head", new.delete).returncode == 0
        assert "vllm_cluster" not in lab.run("head", ["nft", "list", "tables"]).stdout


def test_foreign_tables_stay_untouched_and_cannot_bypass(lab: Lab, ports: dict[str, int], tmp_path: Path) -> None:
    assert lab.nft_file("head", DOCKER + OPERATOR).returncode == 0
    try:
        before = lab.ruleset("head")
        tables = {t: lab.run("head", ["nft", "list", "table", *t.split()]).stdout
                  for t in ("ip nat", "ip filter", "inet operator")}
        config = lab_config(lab)
        command = firewall_command(head_firewall(config), config.nodes[0], state_dir=str(tmp_path),
                                   unit_dir=str(tmp_path))
        assert run_command(lab, "head", command.create).returncode == 0
        for name, text in tables.items():
            assert lab.run("head", ["nft", "list", "table", *name.split()]).stdout == text, name
        # Docker's INPUT accepts everything and the operator accepts 6379 first: our drop is still final.
        assert reach(lab, "out", 6379) == "timeout" and reach(lab, "peer", 6379) == "ok"
        assert reach(lab, "out", 9100) == "timeout"               # the operator's drop still applies
        assert reach(lab, "out", 22) == "ok"
        assert run_command(lab, "head", command.delete).returncode == 0
        assert lab.ruleset("head") == before                     # Docker's and the operator's tables, byte for byte
        assert reach(lab, "out", 6379) == "ok"
    finally:
        lab.sh("head", "nft delete table ip nat; nft delete table ip filter; nft delete table inet operator")
    assert lab.ruleset("head") == ""


def test_a_refused_ruleset_leaves_the_previous_table(lab: Lab, ports: dict[str, int], tmp_path: Path) -> None:
    config = lab_config(lab)
    good = firewall_command(head_firewall(config), config.nodes[0], state_dir=str(tmp_path), unit_dir=str(tmp_path))
    assert run_command(lab, "head", good.create).returncode == 0
    try:
        applied = lab.ruleset("head", "-s")
        broken = head_firewall(config).model_copy(update={"internal_ports": ["6379", "70000"]})
        bad = firewall_command(broken, config.nodes[0], state_dir=str(tmp_path), unit_dir=str(tmp_path))
        done = run_command(lab, "head", bad.create)
        assert done.returncode == 1 and "FAIL firewall-head: nft refused the ruleset, nothing changed" in done.stdout
        assert lab.ruleset("head", "-s") == applied
        assert reach(lab, "out", 6379) == "timeout"               # still protected
    finally:
        assert run_command(lab, "head", good.delete).returncode == 0


def test_without_nft_the_command_cannot_run(lab: Lab, tmp_path: Path) -> None:
    config = lab_config(lab)
    command = firewall_command(head_firewall(config), config.nodes[0], state_dir=str(tmp_path), unit_dir=str(tmp_path))
    done = lab.run("head", ["env", f"PATH={tmp_path}:/bin", "/bin/sh", "-c", command.create], check=False)
    assert done.returncode == 2 and "nft not found" in done.stdout
    assert lab.ruleset("head") == ""


def behind_the_proxy(lab: Lab, mode: str) -> StackConfig:
    """The DP16 wide-EP stack with `mode` load balancing behind the head's nginx, on the lab's head and peer."""
    from bench.dp_lb_real_vllm import dp16
    from stacks.model.loader import parse_config
    from tests.test_load_balancing import proxied

    values = proxied(dp16(mode))
    for node, role in zip(values["nodes"], ("head", "peer"), strict=True):
        node.update(name=role, ssh={"host": lab.v4(role)}, management_ip=lab.v4(role), management_ifname="eth0",
                    data_ips=[lab.v6(role)], nics=["eth0"], hcas=["mlx5_0:1"])
    values["fabric"] |= {"private_networks": [], "public_private_networks": [], "control_plane": "management",
                         "nccl_socket": "management"}
    return parse_config("lab", values)


def test_hybrid_behind_the_proxy_the_other_nodes_api_admits_only_the_head(lab: Lab, tmp_path: Path) -> None:
    """vLLM's key guards only /v1: the peer's API port (hybrid load balancing behind the head's nginx) must take
    connections from the head alone — not from another host of the network — and from the peer itself (its own
    checks and healthcheck, over lo)."""
    config = behind_the_proxy(lab, "hybrid")
    spec = build_plan("lab", config).firewall.nodes[1]
    assert (spec.node, spec.upstream_ports, spec.upstream_sources) == ("peer", ["8000"], [f"{lab.v4('head')}/32"])
    command = firewall_command(spec, config.nodes[1], state_dir=str(tmp_path), unit_dir=str(tmp_path))
    with listeners(lab, "peer", [("api", lab.v4("peer"), 8000)]):
        assert lab.connect("out", lab.v4("peer"), 8000) == "ok"   # without the table: open to the network
        try:
            applied = run_command(lab, "peer", command.create)
            assert applied.returncode == 0, applied.stdout + applied.stderr
            assert lab.connect("head", lab.v4("peer"), 8000) == "ok"      # the head's nginx
            assert lab.connect("out", lab.v4("peer"), 8000) == "timeout"  # any other host: dropped
            assert lab.connect("peer", lab.v4("peer"), 8000) == "ok"      # the node's own checks (iif lo)
        finally:
            assert run_command(lab, "peer", command.delete).returncode == 0


def test_external_behind_the_proxy_every_rank_port_of_the_other_node_admits_only_the_head(lab: Lab,
                                                                                         tmp_path: Path) -> None:
    """External load balancing: the peer runs a server per DP rank on 8000-8007; behind the head's nginx each of
    those ports takes the head and the peer itself, and drops another host; a port outside the ranks' is not
    touched."""
    config = behind_the_proxy(lab, "external")
    spec = build_plan("lab", config).firewall.nodes[1]
    assert (spec.node, spec.upstream_ports, spec.upstream_sources) == ("peer", ["8000-8007"],
                                                                       [f"{lab.v4('head')}/32"])
    command = firewall_command(spec, config.nodes[1], state_dir=str(tmp_path), unit_dir=str(tmp_path))
    ranks = [("rank8", lab.v4("peer"), 8000), ("rank15", lab.v4("peer"), 8007), ("other", lab.v4("peer"), 8008)]
    with listeners(lab, "peer", ranks):
        try:
            applied = run_command(lab, "peer", command.create)
            assert applied.returncode == 0, applied.stdout + applied.stderr
            for port in (8000, 8007):
                assert lab.connect("head", lab.v4("peer"), port) == "ok"      # the head's nginx
                assert lab.connect("out", lab.v4("peer"), port) == "timeout"  # any other host: dropped
                assert lab.connect("peer", lab.v4("peer"), port) == "ok"      # the rank's own checks (iif lo)
            assert lab.connect("out", lab.v4("peer"), 8008) == "ok"           # not a planned port: untouched
        finally:
            assert run_command(lab, "peer", command.delete).returncode == 0

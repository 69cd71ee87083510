"""The host firewall's pure parts: port sets, the rendered table, the remote commands, and the preflight section.

The rendered files are also parsed by the real `nft -c` inside a throwaway network namespace; the behaviour of
the applied table is tested in tests/test_firewall_netns.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from checks.preflight import Context, build_parser, check_firewall
from stacks.model.field_types import SECRET
from stacks.model.loader import load_stack, parse_config
from stacks.planner.firewall import (
    NodeFirewall,
    apply_file,
    apply_script,
    firewall_commands,
    merge,
    node_firewall,
    preflight_args,
    remove_script,
    render_table,
    subtract,
)
from stacks.planner.plan import build_plan
from tests.conftest import plan_of

# Typed from the design (module docstring of stacks/planner/firewall.py), not printed by the code under test.
PROD_NODE1 = """table inet vllm_cluster {
\tset internal_ports {
\t\ttype inet_service
\t\tflags interval
\t\telements = { 13399, 28028, 29700, 32768-60999 }
\t}

\tset internal_v4 {
\t\ttype ipv4_addr
\t\tflags interval
\t\telements = { 1.1.1.0/24, 1.1.2.0/24, 10.30.8.0/24 }
\t}

\tset internal_v6 {
\t\ttype ipv6_addr
\t\tflags interval
\t}

\tset api_ports {
\t\ttype inet_service
\t\tflags interval
\t\telements = { 8030 }
\t}

\tset api_v4 {
\t\ttype ipv4_addr
\t\tflags interval
\t\telements = { 1.1.1.0/24, 1.1.2.0/24, 10.30.8.0/24 }
\t}

\tset api_v6 {
\t\ttype ipv6_addr
\t\tflags interval
\t}

\tchain input {
\t\ttype filter hook input priority filter; policy accept;
\t\tiif "lo" accept
\t\tct state established,related accept
\t\ttcp dport @internal_ports ip saddr != @internal_v4 counter drop comment "internal port, source outside the cluster"
\t\ttcp dport @internal_ports ip6 saddr != @internal_v6 counter drop comment "internal port, source outside the cluster"
\t\ttcp dport @api_ports ip saddr != @api_v4 counter drop comment "API port, source not allowed"
\t\ttcp dport @api_ports ip6 saddr != @api_v6 counter drop comment "API port, source not allowed"
\t}
}
"""


def test_port_ranges_merge_and_subtract() -> None:
    assert merge([(6381, 6381), (6379, 6380), (6383, 6384), (6382, 6382), (10001, 19999), (10002, 10002)]) == [
        (6379, 6384), (10001, 19999)]
    assert subtract([(32768, 60999)], [(40022, 40022), (22, 22)]) == [(32768, 40021), (40023, 60999)]
    assert subtract([(8000, 8000), (8030, 8030)], [(8000, 8000)]) == [(8030, 8030)]
    assert subtract([(100, 200)], [(50, 150), (180, 300)]) == [(151, 179)]


def test_prod_head_table_exactly() -> None:
    plan = build_plan("prod", load_stack("prod"))
    node1, node2 = plan.firewall.nodes
    assert render_table(node1) == PROD_NODE1
    assert apply_file(node1).splitlines()[2:4] == ["add table inet vllm_cluster", "delete table inet vllm_cluster"]
    assert node1.kept_open == ["22", "8030"]
    assert (node2.internal_ports, node2.api_ports, node2.api_sources) == (["28028", "32768-60999"], [], [])
    assert "api_ports" not in render_table(node2)


def test_h20_sets_cover_every_pinned_ray_port() -> None:
    plan = build_plan("h20", load_stack("h20"))
    head, worker = plan.firewall.nodes
    assert head.internal_ports == ["6379-6384", "8265", "10001-19999", "23000-23999", "28028", "29700", "32768-60999"]
    assert worker.internal_ports == ["6380-6384", "10002-19999", "28028", "32768-60999"]
    assert head.cluster_sources == ["192.0.2.0/24", "198.51.100.0/24"]
    for spec in (head, worker):
        covered = [_range(p) for p in spec.internal_ports]
        for x in (x for x in plan.listeners if x.node == spec.node and x.internal):
            assert any(lo <= x.port and (x.port_end or x.port) <= hi for lo, hi in covered), x


def _range(ports: str) -> tuple[int, int]:
    low, _, high = ports.partition("-")
    return int(low), int(high or low)


def test_ssh_and_api_ports_are_never_in_the_internal_set(prod_values: dict[str, Any]) -> None:
    prod_values["nodes"][0]["ssh"]["port"] = 40022          # inside the ephemeral range
    prod_values["serving"]["port"] = 45000                   # so is the API port
    plan = plan_of(prod_values)
    node1 = plan.firewall.nodes[0]
    assert node1.internal_ports == ["13399", "28028", "29700", "32768-40021", "40023-44999", "45001-60999"]
    assert node1.api_ports == ["45000"] and node1.kept_open == ["22", "40022", "45000"]


def test_the_summary_says_what_is_left_out_of_the_cluster_rule_and_why(prod_values: dict[str, Any]) -> None:
    """`kept_open` is "not in the cluster-only rule", not "open to everyone": the API port has its own sources."""
    from stacks.planner.render import render_listeners

    prod_values["nodes"][0]["ssh"]["port"] = 40022
    prod_values["firewall"] = {"api_sources": ["10.30.8.0/25"]}
    plan = plan_of(prod_values)
    node1 = next(line for line in render_listeners(plan) if line.startswith("   node1: "))
    assert "; API 8030 from 10.30.8.0/25; not restricted to the cluster: 22 (ssh), 8030 (API, see its sources), " \
        "40022 (ssh) (sha256 " in node1
    assert "kept open" not in node1


def test_api_sources_default_and_override(prod_values: dict[str, Any]) -> None:
    prod_values["api"] = {"proxy": {"enabled": True}}
    prod_values["serving"]["host"] = "127.0.0.1"
    prod_values |= {"api_key": SECRET, "proxy_keys": {"a": SECRET}, "tls_certificate": SECRET,
                    "tls_private_key": SECRET}
    head = plan_of(prod_values).firewall.nodes[0]
    assert head.api_ports == ["443"] and head.api_sources == ["0.0.0.0/0", "::/0"]
    assert "api_ports" not in render_table(head)   # anywhere: a rule would drop nothing
    assert "8030" in head.internal_ports              # vLLM behind the proxy: cluster only (and loopback-bound)
    prod_values["firewall"] = {"api_sources": ["203.0.113.0/24", "2001:db8::/32", "203.0.113.7"]}
    head = plan_of(prod_values).firewall.nodes[0]
    assert head.api_sources == ["203.0.113.0/24", "2001:db8::/32"]
    assert "elements = { 2001:db8::/32 }" in render_table(head)


def test_no_private_networks_means_the_cluster_addresses(prod_values: dict[str, Any]) -> None:
    prod_values["fabric"] |= {"private_networks": [], "public_private_networks": []}
    plan = plan_of(prod_values)
    head = plan.firewall.nodes[0]
    assert head.cluster_sources == ["1.1.1.1/32", "1.1.1.2/32", "1.1.2.1/32", "1.1.2.2/32", "10.30.8.1/32",
                                    "10.30.8.2/32"]
    assert head.api_sources == head.cluster_sources
    assert any("accepts only 1.1.1.1/32" in n and "firewall.api_sources" in n for n in plan.notes)


def test_firewall_off_warns_and_renders_nothing(h20_values: dict[str, Any]) -> None:
    h20_values["firewall"] = {"enabled": False}
    h20_values["serving"]["host"] = "192.0.2.11"  # vLLM itself on a private address: unfiltered, still private
    plan = plan_of(h20_values)
    assert plan.firewall.enabled is False and plan.firewall.nodes == []
    [warning] = [w for w in plan.warnings if "firewall.enabled is false" in w]
    assert "Ray GCS" in warning and "h20-1:6379" in warning
    assert firewall_commands(parse_config("h20", h20_values), plan.firewall) == {}


def test_commands_timeout_sudo_and_triggers(prod_values: dict[str, Any]) -> None:
    config = parse_config("prod", prod_values)
    plan = build_plan("prod", config)
    cmds = firewall_commands(config, plan.firewall)
    node1 = cmds["node1"]
    assert node1.create == node1.update and node1.create.startswith("timeout 120 sh -c ")
    assert node1.delete.startswith("timeout 120 sh -c ") and "delete table inet vllm_cluster" in node1.delete
    assert node1.ruleset_sha256 == plan.firewall.nodes[0].sha256
    assert "flush ruleset" not in node1.create and "delete table inet vllm_cluster" in node1.create
    prod_values["nodes"][1]["ssh"]["user"] = "ops"
    prod_values["serving"]["max_num_seqs"] = 64                      # not a firewall input
    config2 = parse_config("prod", prod_values)
    cmds2 = firewall_commands(config2, build_plan("prod", config2).firewall)
    assert cmds2["node2"].create.startswith("sudo -n timeout 120 sh -c ")
    assert cmds2["node1"].ruleset_sha256 == node1.ruleset_sha256
    prod_values["firewall"] = {"api_sources": ["10.30.8.0/24"]}
    config3 = parse_config("prod", prod_values)
    assert firewall_commands(config3, build_plan("prod", config3).firewall)["node1"].ruleset_sha256 != \
        node1.ruleset_sha256


def test_scripts_are_valid_shell() -> None:
    plan = build_plan("h20", load_stack("h20"))
    for script in (apply_script(plan.firewall.nodes[0]), remove_script("h20-1"),
                   remove_script("h20-1", owned=True)):
        done = subprocess.run(["sh", "-n"], input=script, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


def test_bad_firewall_config_is_a_config_error(prod_values: dict[str, Any]) -> None:
    prod_values["firewall"] = {"api_sources": ["10.0.0.300/8"], "ephemeral_ports": [60999, 32768]}
    out = subprocess.run([sys.executable, "-m", "stacks", "plan", "prod", "--set", "firewall.ephemeral_ports.0=70000"],
                         cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "firewall.ephemeral_ports" in out.stderr and "Traceback" not in out.stderr
    from stacks.model.errors import ConfigError
    with pytest.raises(ConfigError) as info:
        parse_config("prod", prod_values)
    report = info.value.report()
    assert "firewall.api_sources" in report and "firewall.ephemeral_ports" in report


def _nft_check(text: str) -> subprocess.CompletedProcess[str]:
    """`nft -c -f -` in a namespace of its own: the kernel's parser and validator, nothing applied anywhere."""
    name = f"fw-{os.getpid()}-check"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        return subprocess.run(["ip", "netns", "exec", name, "nft", "-c", "-f", "-"], input=text, capture_output=True,
                              text=True, timeout=30)
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


@pytest.mark.parametrize("stack,overrides", [
    ("prod", {}), ("h20", {}), ("h20", {"firewall": {"api_sources": ["2001:db8::/32", "192.0.2.5"]},
                                         "fabric": {"private_networks": ["192.0.2.0/24", "198.51.100.0/24",
                                                                         "2001:db8::/32"]}}),
    ("prod", {"fabric": {"private_networks": [], "public_private_networks": []}}),
])
def test_real_nft_accepts_every_rendered_file(stack: str, overrides: dict[str, Any], prod_values: dict[str, Any],
                                              h20_values: dict[str, Any]) -> None:
    values = prod_values if stack == "prod" else h20_values
    for key, value in overrides.items():
        values[key] = {**values.get(key, {}), **value}
    for spec in plan_of(values).firewall.nodes:
        done = _nft_check(apply_file(spec))
        assert done.returncode == 0, done.stderr


def test_real_nft_refuses_a_broken_set() -> None:
    spec = NodeFirewall(node="x", internal_ports=["70000"], api_ports=[], cluster_sources=["10.0.0.0/8"],
                        api_sources=[], kept_open=["22"], sha256="")
    done = _nft_check(apply_file(spec))
    assert done.returncode != 0 and "70000" in done.stderr


def _ctx(procfs: Path, ephemeral: str) -> Context:
    return Context(build_parser().parse_args(["--procfs-root", str(procfs), "--ephemeral-ports", ephemeral]))


def test_preflight_firewall_section(tmp_path: Path) -> None:
    proc = tmp_path / "sys/net/ipv4"
    proc.mkdir(parents=True)
    (proc / "ip_local_port_range").write_text("32768\t60999\n")
    ok = check_firewall(_ctx(tmp_path, "32768-60999"))
    assert ok.ok is True and "net.ipv4.ip_local_port_range 32768-60999" in ok.evidence[-1]
    (proc / "ip_local_port_range").write_text("1024\t65000\n")
    wide = check_firewall(_ctx(tmp_path, "32768-60999"))
    assert wide.ok is False and "firewall.ephemeral_ports: [1024, 65000]" in (wide.next_step or "")
    assert preflight_args(load_stack("prod")) == ["--sections", "firewall", "--ephemeral-ports", "32768-60999"]


def test_preflight_without_nft(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "checks.preflight", "--sections", "firewall", "--json"],
                          cwd=Path(__file__).resolve().parent.parent, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and "nft not found" in done.stdout and "apt-get install nftables" in done.stdout


def test_node_firewall_reads_only_its_node(h20_values: dict[str, Any]) -> None:
    config = parse_config("h20", h20_values)
    plan = build_plan("h20", config)
    worker = node_firewall(config, plan.listeners, config.nodes[1])
    assert worker == plan.firewall.nodes[1] and "6379" not in ",".join(worker.internal_ports)


def test_the_unit_reapplies_after_nftables_flushes(tmp_path: Path) -> None:
    """Debian's nftables.service flushes the whole ruleset on start, reload and stop: the unit orders itself after
    it and follows its restarts and reloads; `systemd-analyze verify` accepts the file the script writes."""
    plan = build_plan("h20", load_stack("h20"))
    script = apply_script(plan.firewall.nodes[0], state_dir=str(tmp_path), unit_dir=str(tmp_path))
    unit = script.split("<<VLLM_CLUSTER_UNIT\n", 1)[1].split("\nVLLM_CLUSTER_UNIT", 1)[0]
    unit = unit.replace("$(command -v nft)", shutil.which("nft") or "/usr/sbin/nft")
    for line in ("After=nftables.service", "PartOf=nftables.service", "ReloadPropagatedFrom=nftables.service",
                 f"ExecReload=/usr/sbin/nft -f {tmp_path}/firewall.nft"):
        assert line in unit.splitlines(), line
    (tmp_path / "firewall.nft").write_text("")
    (tmp_path / "vllm-cluster-firewall.service").write_text(unit + "\n")
    done = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "vllm-cluster-firewall.service")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr

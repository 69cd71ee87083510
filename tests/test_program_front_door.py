"""The program's host firewall, pinned SSH and head-side API checks, under Pulumi's mocks."""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from components.ssh_trust import known_hosts_text
from stacks.model.loader import parse_config, read_stack_values
from stacks.planner.firewall import firewall_commands
from stacks.planner.plan import build_plan
from tests.pulumi_harness import Run, run_program, waits_for
from tests.test_policy import HOST_KEYS, with_host_keys

REMOTE = "command:remote:Command"
LOCAL = "command:local:Command"


@pytest.fixture(autouse=True)
def known_hosts_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr("components.ssh_trust.deployer_home", lambda: tmp_path)
    return tmp_path


def _ok(run: Run) -> Run:
    assert run.error is None, run.error
    return run


@pytest.mark.parametrize("stack", ["prod", "h20"])
def test_one_firewall_command_per_node_after_its_preflight_and_before_any_engine(stack: str) -> None:
    run = _ok(run_program(stack))
    values = read_stack_values(stack)
    config = parse_config(stack, values)
    expected = firewall_commands(config, build_plan(stack, config).firewall)
    walls = run.result["firewalls"]
    assert set(walls) == set(expected) == {n["name"] for n in values["nodes"]}
    for name, fw in expected.items():
        registered = run.mocks.named(f"{name}-firewall")
        assert registered.typ == REMOTE
        assert (registered.inputs["create"], registered.inputs["update"], registered.inputs["delete"]) == (
            fw.create, fw.update, fw.delete)
        # no triggers: a rules change updates the table in place; a replacement's late delete would remove it
        assert "triggers" not in registered.inputs and run.all_options[f"{name}-firewall"].delete_before_replace
        preflight = run.mocks.named(f"{name}-firewall-preflight")
        assert preflight.inputs["triggers"][0] == fw.ruleset_sha256 and len(fw.ruleset_sha256) == 64
        assert "--sections firewall --ephemeral-ports 32768-60999" in preflight.inputs["create"]
        assert preflight.inputs["create"].startswith("timeout ")
        node = run.result["nodes"][name]
        assert [d._name for d in run.all_options[f"{name}-firewall"].depends_on] == [f"{name}-firewall-preflight"]
        assert run.all_options[f"{name}-firewall-preflight"].depends_on == [node.preflight]
        # every engine container waits for every node's dry run, and each dry run for its node's firewall
        dry = run.result["engine"].dry_runs[name]
        assert walls[name] in run.all_options[dry._name].depends_on
    # every engine container waits for every dry run: directly, or through the collective checks that do
    collectives = list(run.result["collectives"].values())
    for c in collectives:
        assert all(waits_for(run, c, d) for d in run.result["engine"].dry_runs.values())
    for container in run.result["engine"].containers.values():
        assert all(waits_for(run, container, d) for d in collectives or run.result["engine"].dry_runs.values())
        assert all(waits_for(run, container, wall) for wall in walls.values())


def test_rules_change_updates_the_firewall_and_nothing_else_does() -> None:
    """A rules change is an update of the firewall's command (its `update` applies the new table atomically) and a
    re-run of its preflight; a change outside the rules leaves both alone."""
    base = _ok(run_program("prod"))
    values = copy.deepcopy(read_stack_values("prod"))
    values["serving"]["max_num_seqs"] = 64
    same = _ok(run_program("prod", values))
    values["firewall"] = {"api_sources": ["10.30.8.0/24"]}
    changed = _ok(run_program("prod", values))
    before = {r.name: r.inputs for r in base.mocks.of_type(REMOTE)}
    for name in ("node1-firewall", "node1-firewall-preflight"):
        assert same.mocks.named(name).inputs == before[name]
    wall = changed.mocks.named("node1-firewall").inputs
    assert wall["update"] != before["node1-firewall"]["update"] and "10.30.8.0/24 }" in wall["update"]
    assert changed.mocks.named("node1-firewall-preflight").inputs["triggers"] != \
        before["node1-firewall-preflight"]["triggers"]


def test_firewall_off_registers_no_firewall_and_non_root_uses_sudo() -> None:
    values = copy.deepcopy(read_stack_values("h20"))
    values["firewall"] = {"enabled": False}
    values["serving"]["host"] = "192.0.2.11"  # vLLM's own port on a private address: valid without a filter
    off = _ok(run_program("h20", values))
    assert not [r for r in off.mocks.resources if "firewall" in r.name] and off.result["firewalls"] == {}
    values = copy.deepcopy(read_stack_values("h20"))
    values["nodes"][1]["ssh"]["user"] = "ops"
    sudo = _ok(run_program("h20", values))
    assert sudo.mocks.named("h20-2-firewall").inputs["create"].startswith("sudo -n timeout 120 sh -c ")
    assert " sudo -n python3 - " in sudo.mocks.named("h20-2-firewall-preflight").inputs["create"]
    assert " sudo -n " not in sudo.mocks.named("h20-1-firewall-preflight").inputs["create"]


# --- SSH: pinned host keys on every connection ---------------------------------------------------------------

def _connection(run: Run, name: str) -> dict[str, Any]:
    conn = run.mocks.named(name).inputs["connection"]
    return conn["value"] if "value" in conn and isinstance(conn["value"], dict) else conn


def test_every_ssh_connection_carries_the_nodes_host_key(known_hosts_home: Path) -> None:
    run = _ok(run_program("prod", with_host_keys(read_stack_values("prod"))))
    remotes = run.mocks.of_type(REMOTE)
    assert len(remotes) == 22  # 11 per node (tests/test_program.py counts them)
    for remote in remotes:
        conn = _connection(run, remote.name)
        node = 0 if conn["host"] == "10.30.8.1" else 1
        assert conn["hostKey"] == HOST_KEYS[node], remote.name
    for name in ("node1", "node2"):
        provider = run.mocks.named(f"{name}-docker")
        opts = json.loads(provider.inputs["sshOpts"])
        assert opts[-8:] == ["-o", "StrictHostKeyChecking=yes", "-o",
                             "UserKnownHostsFile=~/.ssh/vllm-cluster/known_hosts.prod",
                             "-o", "GlobalKnownHostsFile=/dev/null", "-o", f"HostKeyAlias={name}.prod.vllm-cluster"]
    # What the program writes before any provider connects (tests/test_ssh_host_keys.py writes and reads it with
    # a real sshd; the lab's `pulumi up` connects through it). Not under mocks: a test's stack `prod` would
    # overwrite the file a real deploy of `prod` on this machine reads.
    config = parse_config("prod", with_host_keys(read_stack_values("prod")))
    assert known_hosts_text("prod", config) == (f"node1.prod.vllm-cluster {HOST_KEYS[0]}\n"
                                                f"node2.prod.vllm-cluster {HOST_KEYS[1]}\n")
    assert not (known_hosts_home / ".ssh").exists(), "the program under mocks wrote a known_hosts file"


def test_without_host_keys_nothing_is_pinned_and_no_file_is_written(known_hosts_home: Path) -> None:
    run = _ok(run_program("prod"))
    assert all("hostKey" not in _connection(run, r.name) for r in run.mocks.of_type(REMOTE))
    assert "StrictHostKeyChecking=yes" not in run.mocks.named("node1-docker").inputs["sshOpts"]
    assert not (known_hosts_home / ".ssh").exists()


# --- vLLM on loopback without the proxy: the API checks run on the head ---------------------------------------

def test_loopback_without_proxy_runs_the_api_checks_on_the_head_in_the_engine() -> None:
    values = copy.deepcopy(read_stack_values("prod"))
    values["serving"]["host"] = "127.0.0.1"
    run = _ok(run_program("prod", values))
    assert not [r for r in run.mocks.of_type(LOCAL) if r.name.startswith("api-")]
    health, smoke = run.mocks.named("api-health"), run.mocks.named("api-smoke")
    assert health.typ == smoke.typ == REMOTE and _connection(run, "api-health")["host"] == "10.30.8.1"
    create = health.inputs["create"]
    first = create.split("\n", 1)[0]
    words = shlex.split(first.split(" <<'")[0])
    # the health deadline + ((1 + 3 requests) x 2 DP ranks x 1 golden pair + 2) request timeouts + 120 s
    assert words[:2] == ["timeout", str(3600 + 600 + ((1 + 3) * 2 * 1 + 2) * 300 + 120)]
    assert words[2:7] == ["docker", "exec", "-i", "deepseek-v41-flash", "python3"]
    assert words[words.index("--url") + 1] == "http://127.0.0.1:8030" == run.outputs["endpoint"]
    assert "environment" not in health.inputs  # the key is the container's own VLLM_API_KEY: nothing travels
    assert "def wait_health(" in create and "class Golden" in create  # checks/api.py with stacks.model.golden inlined
    assert "--sections models,chat,thinking,stream,auth" in smoke.inputs["create"]
    plan = build_plan("prod", parse_config("prod", values))
    assert {c.runs_on for c in plan.checks if c.module == "checks.api"} == {"node"}
    assert any("the API checks run there" in w for w in plan.warnings)


# --- serving.host drives every local path to vLLM ------------------------------------------------------------

@pytest.mark.parametrize(("host", "local", "endpoint"), [
    ("0.0.0.0", "127.0.0.1:8030", "http://10.30.8.1:8030"),
    ("::", "[::1]:8030", "http://10.30.8.1:8030"),
    ("10.30.8.1", "10.30.8.1:8030", "http://10.30.8.1:8030"),
    ("1.1.1.2", "1.1.1.2:8030", "http://1.1.1.2:8030"),        # a data address: the checks follow the bind
    ("127.0.0.1", "127.0.0.1:8030", "http://127.0.0.1:8030"),  # checks on the head
    ("::1", "[::1]:8030", "http://[::1]:8030"),
])
def test_the_healthcheck_upstream_and_checks_follow_serving_host(host: str, local: str, endpoint: str) -> None:
    from stacks.planner.proxy import front_door

    values = copy.deepcopy(read_stack_values("prod"))
    values["serving"]["host"] = host
    config = parse_config("prod", values)
    plan = build_plan("prod", config)
    assert f"'http://{local}/health'" in plan.head.containers[0].healthcheck.test[-1]  # type: ignore[union-attr]
    assert plan.endpoint == endpoint
    assert front_door(config).upstream == local

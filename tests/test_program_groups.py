"""The program with replica groups (components/program.py `build_groups`), under Pulumi's mocks: every group's
engines under names of their own, the groups' turns in order (drain -> replace -> the group's own check ->
undrain, then the next group), the front door over every group, and what a stack without groups keeps."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from tests.pulumi_harness import Run, run_program, waits_for
from tests.test_groups import fronted, lab
from tests.test_program_proxy import SECRETS as PROXY_SECRETS

SECRETS = {"api_key": PROXY_SECRETS["api_key"], "proxy_keys": PROXY_SECRETS["proxy_keys"],
           "tls_certificate": PROXY_SECRETS["tls_certificate"], "tls_private_key": PROXY_SECRETS["tls_private_key"],
           "ssh_private_key": PROXY_SECRETS["ssh_private_key"]}


def values(front_door: bool = True) -> dict[str, Any]:
    v = fronted(lab()) if front_door else lab()
    return {k: x for k, x in v.items() if k not in SECRETS}


@pytest.fixture(scope="module")
def rolled() -> Run:
    run = run_program("lab", values(), secrets=SECRETS)
    assert run.error is None, run.error
    return run


def host(run: Run, name: str) -> str:
    """The host a command resource connects to (a secret connection arrives wrapped with its value)."""
    connection = run.mocks.named(name).inputs["connection"]
    return str(connection.get("value", connection)["host"])


def test_each_group_gets_its_own_engines_and_the_turns_run_in_order(rolled: Run) -> None:
    names = {r.name for r in rolled.mocks.resources}
    assert {"drain-a", "check-a", "undrain-a", "drain-b", "check-b", "undrain-b"} <= names
    assert {"engine-a-lab1-args-dry-run", "engine-b-lab2-args-dry-run", "engine-a-secrets", "engine-b-secrets",
            "fabric-a", "fabric-b"} <= names
    turns = rolled.result["turns"]
    a, b = rolled.result["groups"]["a"].engine, rolled.result["groups"]["b"].engine
    container_a, container_b = a.containers["lab1"], b.containers["lab2"]
    assert waits_for(rolled, container_a, turns["a"]["drain"])
    assert waits_for(rolled, turns["a"]["check"], container_a)
    assert waits_for(rolled, turns["a"]["undrain"], turns["a"]["check"])
    assert waits_for(rolled, turns["b"]["drain"], turns["a"]["undrain"])
    assert waits_for(rolled, container_b, turns["b"]["drain"])
    assert waits_for(rolled, turns["b"]["undrain"], turns["b"]["check"])
    # the staged steps of group b do not wait for group a's turn: they run while group a rolls
    assert not waits_for(rolled, b.dry_runs["lab2"], turns["a"]["undrain"])
    # a group is drained only after its own staged steps passed: a failed dry run leaves it serving
    assert waits_for(rolled, turns["b"]["drain"], b.dry_runs["lab2"])
    # the front door's own checks come after every group's turn
    assert waits_for(rolled, rolled.result["api"].health, turns["b"]["undrain"])


def test_drain_and_undrain_run_on_the_front_door_host_for_the_groups_addresses(rolled: Run) -> None:
    drain_a = rolled.mocks.named("drain-a").inputs
    drain_b = rolled.mocks.named("drain-b").inputs
    assert host(rolled, "drain-a") == host(rolled, "drain-b") == host(rolled, "undrain-b") == "10.231.0.1"
    assert "ip daddr 127.0.0.1 tcp dport 8000" in drain_a["create"]
    assert "ip daddr 10.231.0.2 tcp dport 8000" in drain_b["create"]
    assert "undrain b: back in the upstreams" in rolled.mocks.named("undrain-b").inputs["create"]
    for name in ("drain-a", "undrain-a", "drain-b", "undrain-b"):
        text = rolled.mocks.named(name).inputs["create"]
        assert subprocess.run(["sh", "-n", "-c", text]).returncode == 0, name
        assert SECRETS["api_key"] not in text


def test_a_group_is_checked_on_its_own_vllm_not_through_the_front_door(rolled: Run) -> None:
    check_b = rolled.mocks.named("check-b").inputs
    assert host(rolled, "check-b") == "10.231.0.2"
    assert "docker exec -i lab-engine python3 - --name check-b --url http://10.231.0.2:8000" in check_b["create"]
    check_a = rolled.mocks.named("check-a").inputs["create"].split("<<", 1)[0]  # the command line, not the script
    assert "--url http://127.0.0.1:8000" in check_a and "--ca-env" not in check_a
    # the stack's own checks go through the front door, with no DP rank pinned
    health = rolled.mocks.named("api-health").inputs["create"].split("<<", 1)[0]
    assert "--url https://" in health and "--rank-nodes" not in health


def test_the_front_door_spreads_over_both_groups(rolled: Run) -> None:
    proxy = rolled.mocks.named("api-proxy")
    assert proxy is not None
    assert rolled.outputs["rolling"]["can_roll"] is True
    assert set(rolled.outputs["groups"]) == {"a", "b"}


def test_without_a_front_door_groups_still_take_turns_but_are_not_drained() -> None:
    run = run_program("lab", values(front_door=False), secrets={"ssh_private_key": SECRETS["ssh_private_key"]})
    assert run.error is None, run.error
    names = {r.name for r in run.mocks.resources}
    assert "drain-a" not in names and "undrain-b" not in names
    a, b = run.result["groups"]["a"].engine, run.result["groups"]["b"].engine
    assert waits_for(run, b.containers["lab2"], run.result["turns"]["a"]["check"])
    assert not waits_for(run, a.containers["lab1"], run.result["turns"]["b"]["check"])


def test_a_stack_without_groups_keeps_its_resource_names() -> None:
    run = run_program("prod")
    assert run.error is None, run.error
    names = {r.name for r in run.mocks.resources}
    assert "weights-match" in names and "engine-secrets" in names
    assert not any(n.startswith(("drain-", "undrain-", "check-")) for n in names)


def test_splitting_a_stack_into_groups_replaces_each_container_in_place(rolled: Run) -> None:
    """Each group's container is aliased to its name in the stack of one engine group: Pulumi then replaces it
    (deleted first), instead of creating a second container of the same Docker name beside the old one."""
    opts = rolled.options["engine-b-lab2-lab-engine"]
    assert opts.delete_before_replace is True
    (alias,) = opts.aliases or []
    assert alias.name == "engine-lab2-lab-engine"  # the real engine's use of it: the lab's groups workflow

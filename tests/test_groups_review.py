"""Replica groups under hostile input (stacks/planner/groups.py, rolling.py, stack_plan.py): what a review found
that planned but could not work, or worked but opened a way around the front door. Each test failed before its fix.

The drain scripts run for real here only inside a network namespace of their own (`ip netns`), never against this
machine's own nftables ruleset."""

from __future__ import annotations

import collections
import copy
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from stacks.model.errors import ConfigError
from stacks.model.loader import parse_config
from stacks.planner.firewall import apply_file
from stacks.planner.rolling import DRAIN_TABLE, drain_script, undrain_script
from stacks.planner.stack_plan import build_stack
from tests.conftest import ROOT
from tests.test_groups import fronted, lab, problems

FRONT_DOOR = "10.231.0.1"
"""lab1: the first group's head, where nginx runs; its control-plane address is the one it connects from."""


def later_group(values: dict[str, Any]) -> Any:
    whole = build_stack("t", parse_config("t", values))
    return next(g for g in whole.groups if g.name == "b")


# --- a later group's vLLM: only the front door may reach it -------------------------------------------------------

@pytest.mark.parametrize("api_sources", [None, ["0.0.0.0/0"], ["10.0.0.0/8"]])
def test_a_later_groups_vllm_admits_only_the_front_door_host(api_sources: list[str] | None) -> None:
    """vLLM's key guards only /v1 paths (vllm/entrypoints/serve/middleware/authenticate.py:20-22, 47-60), so a
    later group's vLLM open to the private networks, or to firewall.api_sources (anywhere, for a public front
    door), let anyone there go around the front door's keys, allowlist and limits. It admits the front door's
    host only, as a hybrid node's API server behind the proxy does (listeners.proxy_upstream_sources)."""
    values = fronted(lab())
    if api_sources is not None:
        values["firewall"] = {"api_sources": api_sources}
    group = later_group(values)
    rows = [x for x in group.plan.listeners if x.node == "lab2" and x.port == 8000]
    assert len(rows) == 1 and rows[0].allowed_sources == [f"{FRONT_DOOR}/32"], rows
    assert not rows[0].public
    wall = next(n for n in group.plan.firewall.nodes if n.node == "lab2")
    assert wall.api_sources == [f"{FRONT_DOOR}/32"]
    assert f"{FRONT_DOOR}/32" in apply_file(wall) and "0.0.0.0/0" not in apply_file(wall)
    # the first group's vLLM stays on loopback beside nginx; the front door itself keeps the stack's sources
    front = build_stack("t", parse_config("t", values)).groups[0]
    door = next(x for x in front.plan.listeners if x.node == "lab1" and x.process == "nginx")
    assert door.allowed_sources == (api_sources or ["0.0.0.0/0", "::/0"])


def test_without_a_front_door_a_later_group_keeps_the_stacks_api_sources() -> None:
    """No front door: clients call each group directly, so its API port admits whom the stack says."""
    values = lab()
    values["firewall"] = {"api_sources": ["10.231.0.0/25"]}
    wall = next(n for n in later_group(values).plan.firewall.nodes if n.node == "lab2")
    assert wall.api_sources == ["10.231.0.0/25"]


def test_a_later_groups_note_names_the_front_door_not_firewall_api_sources() -> None:
    """The generic note told the user to widen firewall.api_sources, which a later group behind the front door
    does not read."""
    notes = " ".join(later_group(fronted(lab())).plan.notes)
    assert "need firewall.api_sources" not in notes
    assert f"lab2:8000 accepts only {FRONT_DOOR}/32, the front door on lab1" in notes


# --- resource names -----------------------------------------------------------------------------------------------

def renamed(first: str, second: str, groups: list[tuple[str, str]]) -> dict[str, Any]:
    values = fronted(lab())
    values["nodes"][0]["name"], values["nodes"][1]["name"] = first, second
    values["groups"] = [{"name": g, "nodes": [n]} for g, n in groups]
    return values


def test_group_and_node_names_that_make_one_resource_name_are_refused() -> None:
    """Group a on node b-x and group a-b on node x both named their engine `engine-a-b-x-<container>`: Pulumi
    stops at a duplicate URN after the plan said it was fine."""
    found = problems(renamed("b-x", "x", [("a", "b-x"), ("a-b", "x")]))
    assert "groups.1.name" in found, found
    assert "engine-a-b-x-" in found["groups.1.name"] and "group a" in found["groups.1.name"]


def test_a_group_and_node_name_that_spell_another_nodes_old_name_are_refused() -> None:
    """Splitting a stack aliases each engine to its old name `engine-<node>-…`: group a on node x is
    `engine-a-x-…`, the old name of node a-x's engine, so the split would take over another node's container."""
    found = problems(renamed("x", "a-x", [("a", "x"), ("b", "a-x")]))
    assert "groups.0.name" in found, found
    assert "node a-x" in found["groups.0.name"]


def test_unambiguous_names_still_plan() -> None:
    whole = build_stack("t", parse_config("t", renamed("gpu-a", "gpu-b", [("a", "gpu-a"), ("b", "gpu-b")])))
    assert [g.name for g in whole.groups] == ["a", "b"]


def test_the_program_refuses_the_colliding_names_before_registering_anything() -> None:
    from tests.pulumi_harness import run_program
    from tests.test_program_groups import SECRETS

    values = {k: v for k, v in renamed("b-x", "x", [("a", "b-x"), ("a-b", "x")]).items() if k not in SECRETS}
    run = run_program("lab", values, secrets=SECRETS)
    seen = collections.Counter((r.typ, r.name) for r in run.mocks.resources)
    assert [k for k, n in seen.items() if n > 1] == []
    assert run.error is not None and "groups.1.name" in str(run.error)


# --- one problem once -----------------------------------------------------------------------------------------------

def test_a_stack_wide_problem_is_said_once_not_once_per_group() -> None:
    values = fronted(lab())
    values["parallelism"] = {**values["parallelism"], "dp_load_balancing": "external"}
    with pytest.raises(ConfigError) as caught:
        build_stack("t", parse_config("t", values))
    keys = [p.key for p in caught.value.problems]
    assert keys.count("parallelism.dp_load_balancing") == 1, keys


def test_the_same_problem_in_every_group_is_one_line_naming_the_groups() -> None:
    values = fronted(lab())
    values["serving"] = {**values["serving"], "max_model_len": 100000}
    with pytest.raises(ConfigError) as caught:
        build_stack("t", parse_config("t", values))
    said = [p for p in caught.value.problems if p.key == "serving.max_model_len"]
    assert len(said) == 1 and said[0].message.startswith("groups a, b: above the model's context"), said


# --- what the plan tells the user to run ----------------------------------------------------------------------------

def test_a_grouped_plan_does_not_recommend_the_watch_unit_that_refuses_it() -> None:
    whole = build_stack("t", parse_config("t", fronted(lab())))
    for group in whole.groups:
        notes = " ".join(group.plan.notes)
        assert "watch-unit" not in notes.replace("the watch unit", "")
        assert "watch mode does not handle replica groups yet" in notes


# --- stacks diff with a grouped base that its own code cannot plan -------------------------------------------------

def test_diff_plans_a_grouped_base_with_this_code_when_the_base_has_no_planner(tmp_path: Path) -> None:
    """A project holding only its stack files (`vllm-cluster init`): where the base's own planner does not run,
    the working tree's plans the base's stack file, and a grouped one must be planned group by group."""
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"]
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    stack = tmp_path / "Pulumi.roll.yaml"
    stack.write_text(yaml.safe_dump({"config": {f"vllm-cluster:{k}": v for k, v in lab().items()}}))
    subprocess.run([*git, "init", "-q", "-b", "main"], cwd=tmp_path, check=True)
    subprocess.run([*git, "add", "."], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "groups"], cwd=tmp_path, check=True)
    values = lab()
    values["serving"]["max_model_len"] = 2048
    stack.write_text(yaml.safe_dump({"config": {f"vllm-cluster:{k}": v for k, v in values.items()}}))
    done = subprocess.run([sys.executable, "-m", "stacks", "diff", "roll", "--base", "HEAD", "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={"VLLM_CLUSTER_ROOT": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["validation"]["base"] == {"valid": True, "problems": []}, found["validation"]
    assert set(found["groups"]) == {"a", "b"}
    assert "planned by the working tree's code" in found["base_plan"]


# --- drain / undrain, for real in a network namespace ---------------------------------------------------------------

@pytest.fixture
def netns() -> Iterator[str]:
    if os.geteuid() != 0 or not shutil.which("nft") or not shutil.which("ip"):
        pytest.skip("needs root, nft and ip (a network namespace of its own)")
    name = f"grv-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def in_ns(ns: str, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", ns, "sh", "-c", script], capture_output=True, text=True,
                          timeout=60)


def rules(ns: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, "nft", "list", "ruleset"], capture_output=True,
                          text=True).stdout


def test_a_turn_that_stopped_drained_can_be_run_again(netns: str) -> None:
    """A change that failed in a group's turn (its check failed, its engine did not start) leaves the group
    drained: the next `pulumi up`, with the fix, runs the group's drain again. It refused with exit 3 ("undrain it
    first", with no command to do so), so the stack could not be updated at all. It now takes the group's rules
    as they must be for this change (its servers may have moved) and goes on."""
    first = in_ns(netns, drain_script("b", [("10.0.0.2", 8000)], bound_s=2))
    assert first.returncode == 0, first.stdout + first.stderr
    again = in_ns(netns, drain_script("b", [("10.0.0.2", 8001)], bound_s=2))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "drain b: was still out of the upstreams" in again.stdout
    listed = rules(netns)
    assert listed.count('comment "vllm-cluster group:b"') == 1 and "dport 8001" in listed, listed
    other = in_ns(netns, drain_script("a", [("127.0.0.1", 8000)], bound_s=2))
    assert other.returncode == 0 and 'comment "vllm-cluster group:a"' in rules(netns)
    back = in_ns(netns, undrain_script("b", [("10.0.0.2", 8001)], settle_s=1))
    assert back.returncode == 0, back.stdout + back.stderr
    assert "group:b" not in rules(netns) and 'comment "vllm-cluster group:a"' in rules(netns)
    assert in_ns(netns, undrain_script("a", [("127.0.0.1", 8000)], settle_s=1)).returncode == 0
    assert DRAIN_TABLE not in rules(netns)


def test_the_scripts_parse_for_every_address_family() -> None:
    for script in (drain_script("a-b", [("fd00::0012", 8000), ("10.0.0.2", 9000)]),
                   undrain_script("a-b", [("fd00::12", 8000)])):
        assert subprocess.run(["sh", "-n", "-c", script]).returncode == 0, script


def test_hostile_yaml_in_groups_is_exit_2_with_the_key(tmp_path: Path) -> None:
    """Through the CLI: each refused with exit 2 naming the key, never a traceback."""
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    cases = {"groups.0.name": [{"name": "a;b", "nodes": ["lab1"]}, {"name": "b", "nodes": ["lab2"]}],
             "groups.1.nodes.0": [{"name": "a", "nodes": ["lab1"]}, {"name": "b", "nodes": ["lab1"]}],
             "groups.0": ["a", "b"],
             "groups": [{"name": f"g{i}", "nodes": ["lab1"]} for i in range(257)]}
    for key, groups in cases.items():
        values = copy.deepcopy(lab())
        values["groups"] = groups
        (tmp_path / "Pulumi.h.yaml").write_text(
            yaml.safe_dump({"config": {f"vllm-cluster:{k}": v for k, v in values.items()}}))
        done = subprocess.run([sys.executable, "-m", "stacks", "plan", "h"], cwd=ROOT, capture_output=True,
                              text=True, env={"VLLM_CLUSTER_ROOT": str(tmp_path), "PATH": "/usr/bin:/bin"})
        assert done.returncode == 2 and "Traceback" not in done.stderr, (key, done.stderr)
        assert f"vllm-cluster:{key} = " in done.stderr, (key, done.stderr)


def test_the_diff_names_added_and_removed_groups_in_words_not_python_lists() -> None:
    from review.group_diff import diff_stacks, to_markdown_grouped

    values = fronted(lab())
    base_values = {k: v for k, v in values.items() if k != "groups"}
    base_values["parallelism"] = {**base_values["parallelism"], "data": 2}
    base = build_stack("t", parse_config("t", base_values)).to_json_dict()
    head = build_stack("t", parse_config("t", values)).to_json_dict()
    text = to_markdown_grouped(diff_stacks("t", "main", base, head, [], [], {}))
    assert "- **Groups:** added a, b; removed (the one engine group)" in text, text
    assert "['" not in text


def test_a_later_group_on_another_address_family_than_the_front_door_is_refused() -> None:
    """The front door connects to a later group's vLLM from its own control-plane address, the one that group's
    firewall admits: an IPv6 group behind an IPv4-only front door host planned, and nginx could never reach it."""
    values = fronted(lab())
    values["nodes"][1] |= {"management_ip": "fd00:231::2", "data_ips": ["fd00:231::2"]}
    values["fabric"] = {**values["fabric"], "private_networks": ["10.231.0.0/24", "fd00:231::/64"]}
    found = problems(values)
    assert "groups.1.nodes.0" in found, found
    assert "fd00:231::2" in found["groups.1.nodes.0"] and "10.231.0.1" in found["groups.1.nodes.0"]


def test_a_later_groups_api_checks_are_planned_where_the_program_runs_them() -> None:
    """`pulumi up` checks a later group on its head, in its engine container (`check-<group>`): its firewall
    admits only the front door. Its plan said they ran on the deploying machine."""
    group = later_group(fronted(lab()))
    api = [c for c in group.plan.checks if c.module == "checks.api"]
    assert api and all(c.runs_on == "node" and c.node == "lab2" for c in api), api

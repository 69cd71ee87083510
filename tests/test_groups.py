"""Replica groups (stacks/planner/groups.py, stack_plan.py): each group planned as a stack of its own nodes, the
front door spread over every group's API server, and the plan saying whether a change can roll and why not."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from stacks.model.errors import ConfigError
from stacks.model.field_types import SECRET
from stacks.model.loader import parse_config, read_stack_values
from stacks.planner.plan import build_plan
from stacks.planner.stack_plan import build_stack
from tests.conftest import ROOT

LAB = yaml.safe_load((ROOT / "examples" / "Pulumi.lab.yaml").read_text())["config"]


def lab(**changes: Any) -> dict[str, Any]:
    """The lab example (two one-GPU nodes) as two groups of one node each."""
    values = {k.split(":", 1)[1]: copy.deepcopy(v) for k, v in LAB.items()}
    values["parallelism"]["data"] = 1
    values["groups"] = [{"name": "a", "nodes": ["lab1"]}, {"name": "b", "nodes": ["lab2"]}]
    values.update(changes)
    return values


def fronted(values: dict[str, Any]) -> dict[str, Any]:
    values = copy.deepcopy(values)
    values["serving"] |= {"host": "127.0.0.1"}
    values["api"] = {"proxy": {"enabled": True}}
    return values | {"api_key": SECRET, "proxy_keys": {"team-a": SECRET}, "tls_certificate": SECRET,
                     "tls_private_key": SECRET}


def problems(values: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ConfigError) as caught:
        build_stack("t", parse_config("t", values))
    return {p.key: p.message for p in caught.value.problems}


def test_each_group_is_planned_on_its_own_nodes_behind_one_front_door() -> None:
    whole = build_stack("t", parse_config("t", fronted(lab())))
    assert whole.grouped and [g.name for g in whole.groups] == ["a", "b"]
    a, b = (g.plan for g in whole.groups)
    assert [n.name for n in a.nodes] == ["lab1"] and [n.name for n in b.nodes] == ["lab2"]
    assert a.group == "a" and b.group == "b"
    # the front door is group a's (the stack's head) and spreads over both groups' API servers
    assert a.proxy is not None and b.proxy is None
    assert a.proxy.upstream == "127.0.0.1:8000, 10.231.0.2:8000"
    # group b's vLLM binds its own address, where the front door reaches it (the stack's binds loopback)
    args = b.nodes[0].containers[0].vllm_args or []
    assert args[args.index("--host") + 1] == "10.231.0.2"
    a_args = a.nodes[0].containers[0].vllm_args or []
    assert a_args[a_args.index("--host") + 1] == "127.0.0.1"
    assert whole.rolling.can_roll and whole.rolling.as_dict()["capacity_during_change"] == "1 of 2 groups"


def test_the_json_of_a_grouped_stack_holds_every_groups_plan_and_the_rolling_verdict() -> None:
    out = build_stack("t", parse_config("t", fronted(lab()))).to_json_dict()
    assert [g["name"] for g in out["groups"]] == ["a", "b"]
    assert out["groups"][1]["plan"]["group"] == "b" and out["rolling"]["can_roll"] is True
    plain = build_stack("prod", parse_config("prod", read_stack_values("prod"))).to_json_dict()
    assert "group" not in plain and plain["rolling"]["can_roll"] is False
    assert "one engine group spans every rank (DP2 x TP8 x PP1 with EP over 2 node(s))" in plain["rolling"]["why"]


def test_without_a_front_door_groups_do_not_roll_and_the_plan_says_why() -> None:
    whole = build_stack("t", parse_config("t", lab()))
    assert not whole.rolling.can_roll and "no front door" in whole.rolling.why


def test_a_groups_own_parallelism_is_used() -> None:
    values = lab()
    values["nodes"][1]["gpus"] = {**values["nodes"][1]["gpus"], "count": 2}
    values["groups"][1]["parallelism"] = {"tensor": 2, "data": 1, "backend": "mp"}
    b = build_stack("t", parse_config("t", values)).groups[1].plan
    assert b.topology["tensor"] == 2 and b.nodes[0].gpus_used == 2


@pytest.mark.parametrize(("change", "key", "message"), [
    ({"groups": [{"name": "a", "nodes": ["lab1", "lab2"]}]}, "groups", "one group is the stack itself"),
    ({"groups": [{"name": "a", "nodes": ["lab1"]}, {"name": "a", "nodes": ["lab2"]}]}, "groups.1.name",
     "another group has this name"),
    ({"groups": [{"name": "a", "nodes": ["lab1"]}, {"name": "b", "nodes": ["lab9"]}]}, "groups.1.nodes.0",
     "no node of this name"),
    ({"groups": [{"name": "a", "nodes": ["lab1"]}, {"name": "b", "nodes": ["lab1", "lab2"]}]}, "groups.1.nodes.0",
     "already in group a"),
    ({"groups": [{"name": "a", "nodes": ["lab1"]}, {"name": "b", "nodes": ["lab1"]}]}, "groups",
     "lab2 are in no group"),
    ({"groups": [{"name": "b", "nodes": ["lab2"]}, {"name": "a", "nodes": ["lab1"]}]}, "groups.0.nodes.0",
     "must be the stack's head, lab1"),
])
def test_groups_that_cannot_work_are_refused_with_the_key(change: dict[str, Any], key: str, message: str) -> None:
    found = problems(lab(**change))
    assert key in found and message in found[key], found


@pytest.mark.parametrize("name", ["A", "1a", "a b", "a;id", "a" * 33, "", "é", "a\n"])
def test_group_names_are_refused_by_the_config_type(name: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config("t", lab(groups=[{"name": name, "nodes": ["lab1"]}, {"name": "b", "nodes": ["lab2"]}]))
    assert any(p.key == "groups.0.name" for p in caught.value.problems)


def test_what_groups_do_not_support_yet_is_refused_not_ignored() -> None:
    found = problems(lab(observability={"enabled": True}))
    assert "not built yet" in found["observability.enabled"]
    values = lab()
    values["groups"][1]["parallelism"] = {"tensor": 1, "data": 2, "backend": "mp", "dp_load_balancing": "hybrid"}
    assert "inside a group is not built yet" in problems(values)["groups.1.parallelism.dp_load_balancing"]


def test_a_groups_problem_names_the_group_and_the_stacks_node_index() -> None:
    values = read_stack_values("prod")
    values["parallelism"] = {**values["parallelism"], "data": 1}
    values["groups"] = [{"name": "a", "nodes": ["node1"]}, {"name": "b", "nodes": ["node2"]}]
    found = problems(values)
    assert found["serving.max_model_len"].startswith("group ")
    assert any(m.startswith("group b:") for m in found.values())


def test_a_command_that_plans_one_engine_group_refuses_a_grouped_stack() -> None:
    with pytest.raises(ConfigError) as caught:
        build_plan("t", parse_config("t", lab()))
    assert caught.value.problems[0].key == "groups" and "this command does not yet" in caught.value.problems[0].fix


@pytest.mark.parametrize("command", [["drift"], ["restart-group"], ["watch-unit"]])
def test_the_heal_tools_refuse_a_grouped_stack_with_exit_2(tmp_path: Path, command: list[str]) -> None:
    doc = {"config": {f"vllm-cluster:{k}": v for k, v in lab().items()}}
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.roll.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "stacks", *command, "roll"], cwd=ROOT, capture_output=True,
                          text=True, env={"VLLM_CLUSTER_ROOT": str(tmp_path), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "this stack has groups" in done.stdout + done.stderr


def test_stacks_plan_prints_the_groups_and_their_plans(tmp_path: Path) -> None:
    doc = {"config": {f"vllm-cluster:{k}": v for k, v in lab().items()}}
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.roll.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    env = {"VLLM_CLUSTER_ROOT": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "stacks", "plan", "roll", "--summary"], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("stack roll: 2 replica groups: a (lab1), b (lab2)\na change does not roll: no front")
    assert "#### group a ####" in done.stdout and "#### group b ####" in done.stdout
    as_json = subprocess.run([sys.executable, "-m", "stacks", "plan", "roll", "--json"], cwd=ROOT, env=env,
                             capture_output=True, text=True)
    assert json.loads(as_json.stdout)["rolling"]["groups"] == ["a", "b"]
    plain = subprocess.run([sys.executable, "-m", "stacks", "plan", "prod"], cwd=ROOT, capture_output=True, text=True)
    assert "replace the whole group in start order (it cannot roll: one engine group spans every rank" in plain.stdout


# --- stacks diff of a stack with groups (review/group_diff.py) ------------------------------------------------------

def _older_image(plan_json: dict[str, Any]) -> dict[str, Any]:
    older = copy.deepcopy(plan_json)
    for group in older["groups"]:
        for node in group["plan"]["nodes"]:
            for container in node["containers"]:
                container["image"] = "older:1"
                container["labels"]["vllm-cluster.generation"] = "older"
    return older


def test_the_diff_of_an_image_change_says_the_groups_roll_without_downtime() -> None:
    from review.group_diff import diff_stacks, to_markdown_grouped

    head = build_stack("t", parse_config("t", fronted(lab()))).to_json_dict()
    found = diff_stacks("t", "main", _older_image(head), head, [], [], {})
    assert found["downtime"].startswith("none expected for the endpoint: 2 group(s) change and roll one at a time")
    assert "1 of 2 groups serving meanwhile" in found["downtime"]
    text = to_markdown_grouped(found)
    assert "### group a (staged:" in text and "### group b (staged:" in text and "- **Rolling:** yes" in text
    same = diff_stacks("t", "main", head, head, [], [], {})
    assert same["downtime"] == "none: no group's engines change"


def test_the_diff_without_a_front_door_says_each_group_is_down_in_turn() -> None:
    from review.group_diff import diff_stacks

    head = build_stack("t", parse_config("t", lab())).to_json_dict()
    found = diff_stacks("t", "main", _older_image(head), head, [], [], {})
    assert found["downtime"].startswith("the groups change one after another, each down for its own restart")


def test_the_diff_of_splitting_a_stack_into_groups_is_one_whole_restart() -> None:
    from review.group_diff import diff_stacks

    values = fronted(lab())
    base_values = {k: v for k, v in values.items() if k != "groups"}
    base_values["parallelism"] = {**base_values["parallelism"], "data": 2}
    base = build_stack("t", parse_config("t", base_values)).to_json_dict()
    head = build_stack("t", parse_config("t", values)).to_json_dict()
    found = diff_stacks("t", "main", base, head, [], [], {})
    assert found["downtime"].startswith("the stack is split into replica groups: every engine container is replaced")
    assert found["added"] == ["a", "b"] and found["removed"] == ["(the one engine group)"]


def test_stacks_diff_of_a_grouped_stack_from_a_git_base(tmp_path: Path) -> None:
    """The real command: the base planned by its own code at the commit, the change by this code."""
    from tests.test_review_tools import GIT, diff, make_repo

    repo = make_repo(tmp_path)
    doc = {"config": {f"vllm-cluster:{k}": v for k, v in lab().items()}}
    (repo / "Pulumi.roll.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    (repo / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    subprocess.run([*GIT, "add", "."], cwd=repo, check=True)
    subprocess.run([*GIT, "commit", "-qm", "groups"], cwd=repo, check=True)
    values = lab()
    values["serving"]["max_model_len"] = 2048
    doc = {"config": {f"vllm-cluster:{k}": v for k, v in values.items()}}
    (repo / "Pulumi.roll.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    out = diff(repo, "roll", "--base", "HEAD")
    assert out.returncode == 0, out.stderr
    assert "## `roll`: plan at `HEAD` → working tree (replica groups)" in out.stdout
    assert "- **Downtime:** the groups change one after another, each down for its own restart" in out.stdout
    assert "### group a" in out.stdout and "argv `--max-model-len`: `4096` → `2048`" in out.stdout
    as_json = json.loads(diff(repo, "roll", "--base", "HEAD", "--json").stdout)
    assert set(as_json["groups"]) == {"a", "b"} and as_json["rolling"]["can_roll"] is False

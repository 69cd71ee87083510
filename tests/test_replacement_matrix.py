"""The replacement matrix, computed: every key of the schema changed alone in both committed stacks, the real
program run under Pulumi's mocks before and after, every registered resource classified by its provider's rules
(review/replacement.py). The assertions are the fail-stop contract of issue 12: nothing that leaves every
process unchanged restarts an engine, no change restarts part of the group, a group restart is one key."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from review.cli import MATRIX_BEGIN, MATRIX_END, MATRIX_PAGE, build_parser, main, page_with_matrix
from review.config_mutations import BASE_SECRETS, leaves
from review.matrix import CODE_CHANGES, compute
from review.registrations import ProgramError, register
from review.replacement import (
    CONTAINER,
    CONTAINER_REPLACE_INPUTS,
    SPEC_INPUTS,
    Registration,
    Row,
    action,
    downtime,
    impact,
    markdown,
)
from stacks.model.config import SECRET_KEYS, SECRET_OBJECT_KEYS
from stacks.model.loader import parse_config, read_stack_values
from stacks.planner.container_spec import ContainerSpec
from stacks.planner.launch import ENGINE_REPLACE_ON_CHANGES, GENERATION_FIELDS, NOT_GENERATION_FIELDS
from stacks.planner.plan import build_plan
from tests.conftest import ROOT

STACKS = ("h20", "prod")
PROCESS_INPUTS = (CONTAINER_REPLACE_INPUTS - {"labels"}) | {"healthcheck"}
"""What a process sees of its container: everything that replaces it except the labels the generation rides on."""
SECRET_ROWS = set(SECRET_KEYS) | set(SECRET_OBJECT_KEYS)


@pytest.fixture(scope="module")
def rows() -> list[Row]:
    return compute({s: read_stack_values(s) for s in STACKS}, register)


def row(rows: list[Row], stack: str, key: str) -> Row:
    return next(r for r in rows if r.stack == stack and r.key == key)


def test_every_key_of_the_schema_has_a_row_in_every_stack(rows: list[Row]) -> None:
    keys = [leaf.key for leaf in leaves()] + [c.key for c in CODE_CHANGES]
    for stack in STACKS:
        assert [r.key for r in rows if r.stack == stack] == keys
    assert len(keys) > 100
    # Each row either changed something (a value the whole plan accepted) or says why the key cannot change alone;
    # no key lacks a value generator for its type.
    for r in rows:
        assert (r.refused is None) == bool(r.change), (r.stack, r.key)
        assert r.refused is None or "no candidate value" not in r.refused, (r.stack, r.key, r.refused)


def test_no_row_restarts_part_of_the_group(rows: list[Row]) -> None:
    assert [(r.stack, r.key) for r in rows if r.impact.engines == "partial"] == []
    assert [(r.stack, r.key) for r in rows if r.downtime.kind == "lone-rank"] == []
    # every resource type the program registers has a provider rule (a new type needs one in review/replacement.py)
    assert [(r.stack, r.key, r.impact.unclassified) for r in rows if r.impact.unclassified] == []


def test_only_a_process_change_or_a_group_restart_replaces_the_engines(rows: list[Row]) -> None:
    """Engines replaced <=> some engine container's process-visible input changed (env, argv, image, mounts, …) or
    an engine container comes or goes (a node added, removed, renamed), or the one key whose job is to restart the
    group."""
    for r in rows:
        process = (set(r.impact.engine_inputs) & PROCESS_INPUTS) | set(r.impact.engines_added_removed)
        if r.impact.engines == "replaced":
            assert process or r.key == "container.restart_epoch", (r.stack, r.key, r.impact.engine_inputs)
        if process:
            assert r.impact.engines == "replaced", (r.stack, r.key, r.impact.engine_inputs)


def test_the_rows_the_issue_names_restart_nothing(rows: list[Row]) -> None:
    """model.load_gb_per_s, fabric.private_networks and code-only changes: policy facts and check re-runs only."""
    for stack in STACKS:
        for key in ("model.load_gb_per_s", "fabric.private_networks", *(c.key for c in CODE_CHANGES)):
            r = row(rows, stack, key)
            assert r.refused is None and r.downtime.kind == "none", (stack, key)
            assert (r.impact.engines, r.impact.proxy, r.impact.images, r.impact.other) == ("", "", [], []), (stack, key)
            assert set(r.impact.state) <= {"policy-facts"}
        assert row(rows, stack, "model.load_gb_per_s").impact.state == ["policy-facts"]
        assert row(rows, stack, "fabric.private_networks").impact.state == ["policy-facts"]
        assert row(rows, stack, "(code) stacks/planner/outage.py STARTUP_S").impact.state == ["policy-facts"]
        assert row(rows, stack, "(code) stacks/planner/launch.py container purpose").impact.actions == {}


def test_restart_epoch_replaces_the_whole_group_and_reruns_every_check(rows: list[Row]) -> None:
    for stack in STACKS:
        r = row(rows, stack, "container.restart_epoch")
        assert r.change == "container.restart_epoch: 0 → 1"
        assert r.impact.engines == "replaced" and r.impact.engine_inputs == ["labels"]  # the generation, nothing else
        # every check re-runs, as for any process change of the group, preflights included
        assert r.impact.checks == row(rows, stack, "serving.max_num_seqs").impact.checks
        assert set(r.impact.checks) >= {"<node>-preflight", "fabric-<node>-fabric-preflight",
                                        "engine-<node>-args-dry-run", "api-health", "api-smoke",
                                        "fabric-<node>-nccl-transport"}
        assert r.impact.images == [] and r.impact.proxy == "" and r.downtime.kind == "group"
        outage = build_plan(stack, parse_config(stack, read_stack_values(stack))).model["outage"]
        estimate = outage[outage["applies"]]["total_s"]  # the modelled outage of the restart the program performs
        assert r.downtime.seconds == estimate and estimate > 60


def test_an_image_change_pulls_everywhere_reruns_the_dry_runs_and_replaces_the_group(rows: list[Row]) -> None:
    for stack in STACKS:
        for key in ("image.tag", "image.repository", "image.digest"):
            r = row(rows, stack, key)
            assert r.impact.engines == "replaced" and "image" in r.impact.engine_inputs
            assert r.impact.images == ["<node>-image (pulled)"]
            assert "engine-<node>-args-dry-run" in r.impact.checks
            assert set(r.impact.checks) >= set(row(rows, stack, "container.restart_epoch").impact.checks)


def test_restart_policy_is_updated_in_place_and_secrets_move_the_whole_group(rows: list[Row]) -> None:
    for stack in STACKS:
        restart = row(rows, stack, "container.restart")
        assert restart.impact.engines == "updated" and restart.impact.engine_inputs == ["restart"]
        assert restart.downtime.kind == "none" and restart.impact.checks == []
        key = row(rows, stack, "api_key")  # only the head's env holds it; its secrets holder moves the rest
        assert key.impact.engines == "replaced" and key.downtime.kind == "group"
        # the holder's new ID in every container's secrets label replaces them (labels force a replacement)
        assert key.impact.actions["engine-<node>-<container>"].startswith("replace: ") and \
            "labels" in key.impact.actions["engine-<node>-<container>"], key.impact.actions
        assert key.impact.actions["engine-secrets"].startswith("replace: triggers changed")
        ssh = row(rows, stack, "ssh_private_key")  # the check connections only
        assert ssh.impact.engines == "" and ssh.impact.checks and ssh.downtime.kind == "none"


def test_proxy_keys_cost_seconds_and_touch_no_engine(rows: list[Row]) -> None:
    for stack in STACKS:
        r = row(rows, stack, "api.proxy.port")
        assert r.context == "with the proxy on"
        assert (r.impact.engines, r.impact.proxy, r.downtime.kind) == ("", "replaced", "proxy")
        client = row(rows, stack, "api.proxy.check_client")
        assert client.impact.proxy == "" and client.impact.checks == ["api-health", "api-smoke"]
        on = row(rows, stack, "api.proxy.enabled")  # vLLM moves to loopback: the group restarts too
        assert on.context == "" and on.impact.engines == "replaced" and on.impact.proxy == "replaced"


def test_the_load_balancing_row_switches_to_every_other_mode(rows: list[Row]) -> None:
    """`parallelism.dp_load_balancing` is the switch of two contexts, one per mode: its row changes it to each,
    and both restart the whole group (external also replaces each node's container by one per DP rank)."""
    for stack in STACKS:
        r = row(rows, stack, "parallelism.dp_load_balancing")
        assert r.refused is None and r.context == ""
        assert [part.split(" (with ")[0] for part in r.change.split("; ")] == [
            "parallelism.dp_load_balancing: (unset) → hybrid", "parallelism.dp_load_balancing: (unset) → external"]
        assert (r.impact.engines, r.downtime.kind, r.diff_downtime) == ("replaced", "group", "group")
        assert r.impact.engines_added_removed == ["engine-<node>-<container> (delete)",
                                                  "engine-<node>-<container>-dp<r> (create)"]


def test_stacks_diff_reads_the_same_downtime_from_the_plans(rows: list[Row]) -> None:
    """The plan-level rules of `stacks diff` agree with the program-level matrix on every change a plan can show
    (secret values are not in plans)."""
    for r in rows:
        if r.refused is None and r.key not in SECRET_ROWS:
            assert r.diff_downtime == r.downtime.kind, (r.stack, r.key, r.diff_downtime, r.downtime.kind)


def test_the_docs_print_the_matrix(rows: list[Row]) -> None:
    page = (ROOT / MATRIX_PAGE).read_text()
    table = markdown(rows, list(STACKS))
    assert page_with_matrix(page, table) == page, (
        f"{MATRIX_PAGE}'s replacement matrix is stale: run `venv/bin/python -m stacks matrix --update-docs`")
    assert MATRIX_BEGIN in page and MATRIX_END in page


# --- the rules themselves, on hand-made registrations ---------------------------------------------------

def _engine(name: str, envs: list[str], generation: str = "g1", holder: str = "secrets-d1",
            **inputs: Any) -> Registration:
    labels = [{"label": "vllm-cluster.generation", "value": generation},
              {"label": "vllm-cluster.secrets-generation", "value": holder}]
    return Registration(CONTAINER, name, {"envs": envs, "labels": labels, **inputs},
                        replace_on_changes=ENGINE_REPLACE_ON_CHANGES, delete_before_replace=True)


def _holder(digest: str) -> Registration:
    return Registration("command:local:Command", "secrets", {"create": "echo", "triggers": [digest]})


def test_a_change_to_one_engine_alone_is_reported_as_a_lone_rank_restart() -> None:
    """What the generation label and the secrets holder exist to prevent, seen by the rules."""
    before = [_holder("d1"), _engine("engine-a", ["A=1"]), _engine("engine-b", ["B=1"])]
    after = [_holder("d1"), _engine("engine-a", ["A=2"]), _engine("engine-b", ["B=1"])]
    found = impact(before, after)
    assert found.engines == "partial"
    assert downtime(found.engines, found.proxy, 600).kind == "lone-rank"
    together = impact(before, [_holder("d1"), _engine("engine-a", ["A=2"], "g2"), _engine("engine-b", ["B=1"], "g2")])
    assert together.engines == "replaced" and downtime(together.engines, "", 600).seconds == 600
    rotated = impact(before, [_holder("d2"), _engine("engine-a", ["A=1"], holder="secrets-d2"),
                              _engine("engine-b", ["B=1"], holder="secrets-d2")])
    assert rotated.engines == "replaced" and rotated.actions["secrets"].startswith("replace: triggers changed")
    assert rotated.checks == [] and rotated.other == ["secrets (replace)"]  # the holder is no check
    assert rotated.actions["engine-b"] == "replace: willReplaceOnChanges: labels (labels)"


def test_provider_rules() -> None:
    old = Registration(CONTAINER, "c", {"restart": "unless-stopped", "image": "sha256:1"})
    assert action(old, Registration(CONTAINER, "c", {"restart": "no", "image": "sha256:1"})).kind == "update"  # type: ignore[union-attr]
    assert action(old, Registration(CONTAINER, "c", {"restart": "no", "image": "sha256:2"})).kind == "replace"  # type: ignore[union-attr]
    hc = Registration(CONTAINER, "c", {"healthcheck": {"tests": ["x"]}}, replace_on_changes=("healthcheck",))
    assert action(Registration(CONTAINER, "c", {"healthcheck": {}}, replace_on_changes=("healthcheck",)), hc
                  ).kind == "replace"  # type: ignore[union-attr]
    cmd = Registration("command:remote:Command", "k", {"create": "a", "triggers": ["1"]})
    assert action(cmd, Registration(cmd.type, "k", {"create": "b", "triggers": ["1"]})).kind == "update"  # type: ignore[union-attr]
    assert action(cmd, Registration(cmd.type, "k", {"create": "a", "triggers": ["2"]})).kind == "replace"  # type: ignore[union-attr]
    img = Registration("docker:index/remoteImage:RemoteImage", "i", {"name": "a", "keepLocally": True})
    assert action(img, Registration(img.type, "i", {"name": "b", "keepLocally": True})).kind == "replace"  # type: ignore[union-attr]
    prov = Registration("pulumi:providers:docker", "p", {"host": "ssh://a"})
    assert action(prov, Registration(prov.type, "p", {"host": "ssh://b"})).kind == "update"  # type: ignore[union-attr]
    facts = Registration("vllm-cluster:index:PolicyFacts", "f", {"x": 1}, custom=False)
    assert action(facts, Registration(facts.type, "f", {"x": 2}, custom=False)).kind == "state"  # type: ignore[union-attr]
    assert action(None, facts).kind == "create" and action(facts, None).kind == "delete"  # type: ignore[union-attr]
    assert action(facts, facts) is None


def test_the_generation_hashes_exactly_the_replacing_fields() -> None:
    """A ContainerSpec field enters the group's generation iff the docker input it feeds replaces a container;
    every field is on one side, so a new field forces the decision."""
    replacing = {f for f, i in SPEC_INPUTS.items() if i in CONTAINER_REPLACE_INPUTS or i in ENGINE_REPLACE_ON_CHANGES}
    assert set(GENERATION_FIELDS) == replacing - {"labels"}
    assert set(GENERATION_FIELDS) | set(NOT_GENERATION_FIELDS) == set(ContainerSpec.model_fields)
    assert not set(GENERATION_FIELDS) & set(NOT_GENERATION_FIELDS)


def test_restart_policy_warnings_and_the_epoch() -> None:
    values = read_stack_values("h20")
    h20 = build_plan("h20", parse_config("h20", values))
    assert not any("container.restart" in w for w in h20.warnings)
    generation = h20.head.containers[0].labels["vllm-cluster.generation"]
    for policy in ("unless-stopped", "always", "on-failure"):
        changed = copy.deepcopy(values)
        changed["container"]["restart"] = policy
        plan = build_plan("h20", parse_config("h20", changed))
        assert any(w.startswith(f"container.restart is {policy!r}: Docker restarts one dead rank alone, and it hangs")
                   for w in plan.warnings)
        assert plan.head.containers[0].labels["vllm-cluster.generation"] == generation  # docker update, in place
    prod = build_plan("prod", parse_config("prod", read_stack_values("prod")))
    assert any("container.restart is 'unless-stopped'" in w for w in prod.warnings)  # seed 000's value, warned
    bumped = copy.deepcopy(values)
    bumped["container"]["restart_epoch"] = 7
    epoch = build_plan("h20", parse_config("h20", bumped))
    assert {n.containers[0].labels["vllm-cluster.generation"] for n in epoch.nodes} != {generation}
    assert len({n.containers[0].labels["vllm-cluster.generation"] for n in epoch.nodes}) == 1


def test_the_cli_prints_json_and_refuses_bad_input(rows: list[Row], capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's own part: which stacks it reads, the JSON it prints, its exit codes. The rows themselves are the
    module's (computed once above, by the same `compute`)."""
    asked: list[list[str]] = []

    def computed(values: dict[str, Any], program: Any) -> list[Row]:
        assert program is register and values == {"h20": read_stack_values("h20")}
        asked.append(list(values))
        return [r for r in rows if r.stack == "h20"]

    monkeypatch.setattr("review.matrix.compute", computed)
    assert main(["matrix", "h20", "--json"]) == 0
    assert asked == [["h20"]]
    data = json.loads(capsys.readouterr().out)
    assert [r["key"] for r in data] == [leaf.key for leaf in leaves()] + [c.key for c in CODE_CHANGES]
    epoch = next(r for r in data if r["key"] == "container.restart_epoch")
    assert epoch["impact"]["engines"] == "replaced" and epoch["downtime"]["kind"] == "group"
    assert main(["matrix", "no-such-stack"]) == 2
    assert "no Pulumi.no-such-stack.yaml" in capsys.readouterr().err
    with pytest.raises(ValueError, match="has no"):
        page_with_matrix("# no markers here\n", "| table |\n")


def test_update_docs_keeps_its_old_spelling() -> None:
    """`--update-docs` rewrites docs/what-a-change-costs.md; `--update-readme`, from when the table lived in the
    README, is the same option."""
    for flag in ("--update-docs", "--update-readme"):
        assert build_parser().parse_args(["matrix", flag]).update_docs is True
    assert build_parser().parse_args(["matrix"]).update_docs is False


def test_a_refused_config_registers_nothing() -> None:
    values = copy.deepcopy(read_stack_values("prod"))
    values["parallelism"]["tensor"] = 16
    with pytest.raises(ProgramError, match=r"parallelism\.tensor"):
        register("prod", values, dict(BASE_SECRETS))


def test_a_stack_with_secrets_objects_and_string_forms_gets_its_rows() -> None:
    """A stack file's own secrets (`proxy_keys`, `env_secrets`, `api_key` as `{secure: …}`) and the one-string forms
    of `image` and `model.source` once crashed the matrix (exit 3): they are handed to the program as secrets and
    mutated as mappings."""
    from stacks.model.field_types import SECRET

    values = copy.deepcopy(read_stack_values("h20"))
    values["image"] = "vllm/vllm-openai:v0.33.0"
    values["model"]["source"] = "s3://team-weights/deepseek/DeepSeek-V4-Flash"
    values["serving"]["host"] = "127.0.0.1"
    values["api"] = {"proxy": {"enabled": True}}
    values |= {"api_key": SECRET, "proxy_keys": {"team-a": SECRET}, "env_secrets": {"HF_TOKEN": SECRET},
               "tls_certificate": SECRET, "tls_private_key": SECRET}
    keys = [leaf for leaf in leaves() if leaf.key in ("image.tag", "model.source.region", "api.proxy.max_body_mb")]
    rows = compute({"h20": values}, register, keys)
    by_key = {r.key: r for r in rows if r.stack == "h20"}
    assert {"image.tag", "model.source.region", "api.proxy.max_body_mb"} <= set(by_key), sorted(by_key)
    assert by_key["image.tag"].downtime.kind == "group"

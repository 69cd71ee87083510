"""The wired checks in the Pulumi program, under Pulumi's mocks: which resources exist, what each depends on, what
re-runs them, what the commands say per rank, and that no secret reaches a command or a plain input."""

from __future__ import annotations

import copy
import json
import shlex
import subprocess
import sys
from typing import Any

import pytest

from stacks.model.loader import read_stack_values
from tests.conftest import ROOT
from tests.pulumi_harness import SECRET_VALUES, Run, run_program, waits_for
from tests.test_program import CONTAINER, SECRET_SIG, SECRET_VALUE

SOURCE = {"url": "s3://team-weights/deepseek/DeepSeek-V4.1-Flash", "endpoint_url": "https://minio.internal:9000"}
S3 = {"s3_access_key_id": "AKIAWIRECHECK0000001", "s3_secret_access_key": "wire-check-secret-key/abc+def",
      "s3_session_token": "wire-check-session-token-xyz"}
HASH_A, HASH_B = "a" * 64, "b" * 64


def verdict(name: str, value: str) -> str:
    return json.dumps({"check": name, "status": "pass", "summary": f"ok; manifest-sha256={value}",
                       "details": {"hash": value}})


def with_source(**source: Any) -> dict[str, Any]:
    values = copy.deepcopy(read_stack_values("prod"))
    values["model"]["source"] = SOURCE | source
    return values


def deps(run: Run, name: str) -> list[Any]:
    return list(run.all_options[name].depends_on or [])


def unwrap(value: Any) -> Any:
    return value["value"] if isinstance(value, dict) and SECRET_SIG in value else value


@pytest.fixture(scope="module")
def local() -> Run:
    """prod as committed: the nodes' own directories, verified."""
    run = run_program("prod", stdout={"node1-weights": verdict("weights-node1", HASH_A),
                                      "node2-weights": verdict("weights-node2", HASH_A)})
    assert run.error is None, run.error
    return run


@pytest.fixture(scope="module")
def synced() -> Run:
    """prod with a model.source and the three S3 secrets."""
    run = run_program("prod", with_source(), secrets={**SECRET_VALUES, **S3},
                      stdout={"node1-weights": verdict("weights-node1", HASH_A),
                              "node2-weights": verdict("weights-node2", HASH_B)})
    assert run.error is None, run.error
    return run


# --- order on each node -------------------------------------------------------------------------------------------

def test_local_weights_are_verified_first_then_pre_pull_then_pull_then_preflight(local: Run) -> None:
    for name, node in local.result["nodes"].items():
        assert deps(local, f"{name}-weights") == []
        assert deps(local, f"{name}-pre-pull") == [node.weights]
        assert deps(local, f"{name}-image") == [node.pre_pull]
        assert set(deps(local, f"{name}-preflight")) == {node.image, node.weights}
        weights = local.mocks.named(f"{name}-weights").inputs
        assert weights["create"].startswith("timeout 3600 python3 - verify --dest ") and "stdin" not in weights
        assert local.mocks.named(f"{name}-pre-pull").inputs["create"].split(" --sections ")[1].startswith(
            "ownership,disk,gpu,model ")


def test_with_a_source_pre_pull_then_pull_then_sync_then_preflight(synced: Run) -> None:
    for name, node in synced.result["nodes"].items():
        assert deps(synced, f"{name}-pre-pull") == []
        assert deps(synced, f"{name}-image") == [node.pre_pull]
        assert deps(synced, f"{name}-weights") == [node.image]
        assert set(deps(synced, f"{name}-preflight")) == {node.image, node.weights}
        create = synced.mocks.named(f"{name}-weights").inputs["create"]
        assert " docker run --rm -i --network host --pull never " in create
        assert f" sync --source {SOURCE['url']} " in create
        assert synced.mocks.named(f"{name}-preflight").inputs["create"].split(" --sections ")[1].startswith(
            "model,toolkit,memlock ")


def test_no_engine_moves_before_weights_match_dry_runs_and_collectives(synced: Run) -> None:
    match = synced.result["weights_match"]
    nodes, engine = synced.result["nodes"], synced.result["engine"]
    assert set(deps(synced, "weights-match")) == {n.weights for n in nodes.values()}
    for name in nodes:
        assert match in deps(synced, f"engine-{name}-args-dry-run")
        collective = synced.result["collectives"][name]
        assert all(waits_for(synced, collective, d) for d in engine.dry_runs.values())
    for container in engine.containers.values():
        assert all(waits_for(synced, container, c) for c in synced.result["collectives"].values())
        assert waits_for(synced, container, match)


# --- weights: triggers, stdin, hashes, the comparison ---------------------------------------------------------------

def test_weights_outputs_and_the_comparison_command(synced: Run, local: Run) -> None:
    assert local.outputs["weights"] == {"node1": HASH_A, "node2": HASH_A}
    assert synced.outputs["weights"] == {"node1": HASH_A, "node2": HASH_B}
    create = synced.mocks.named("weights-match").inputs["create"]
    assert shlex.split(create) == ["venv/bin/python", "-m", "checks.weights_match", "--name", "weights-match",
                                   f"node1={HASH_A}", f"node2={HASH_B}"]
    done = subprocess.run([sys.executable, *shlex.split(create)[1:]], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and done.stdout.startswith("FAIL weights-match: the nodes hold 2 different sets")
    assert f"node1: {HASH_A}" in done.stdout and f"node2: {HASH_B}" in done.stdout
    same = subprocess.run([sys.executable, *shlex.split(local.mocks.named("weights-match").inputs["create"])[1:]],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert same.returncode == 0 and same.stdout.startswith("PASS weights-match: all 2 node(s) hold the same")


def test_a_node_without_a_hash_fails_the_comparison() -> None:
    run = run_program("prod", stdout={"node1-weights": verdict("weights-node1", HASH_A),
                                      "node2-weights": "FAIL weights-node2: 1 missing: model-00002.safetensors"})
    assert run.outputs["weights"] == {"node1": HASH_A, "node2": None}
    create = shlex.split(run.mocks.named("weights-match").inputs["create"])
    assert create[-1] == "node2="
    done = subprocess.run([sys.executable, *create[1:]], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "node2 holds other weights" in done.stdout


def test_credentials_reach_only_the_weights_stdin_as_a_secret(synced: Run) -> None:
    for name in ("node1", "node2"):
        inputs = synced.mocks.named(f"{name}-weights").inputs
        assert inputs["stdin"][SECRET_SIG] == SECRET_VALUE
        assert unwrap(inputs["stdin"]) == (f"AWS_ACCESS_KEY_ID={S3['s3_access_key_id']}\n"
                                           f"AWS_SECRET_ACCESS_KEY={S3['s3_secret_access_key']}\n"
                                           f"AWS_SESSION_TOKEN={S3['s3_session_token']}\n")
    for r in synced.mocks.resources:
        for key, value in r.inputs.items():
            if isinstance(value, dict) and SECRET_SIG in value:
                continue
            text = json.dumps(value, default=str)
            for secret in (*S3.values(), SECRET_VALUES["api_key"]):
                assert secret not in text, (r.name, key)
    assert not any(s in json.dumps(synced.outputs, default=str) for s in S3.values())


def test_an_instance_role_source_sends_no_stdin() -> None:
    run = run_program("prod", with_source())
    assert run.error is None, run.error
    assert "stdin" not in run.mocks.named("node1-weights").inputs


def test_a_plain_s3_secret_registers_nothing() -> None:
    values = with_source() | {"s3_secret_access_key": "plain-text-secret-key-123"}
    run = run_program("prod", values, secrets={**SECRET_VALUES, "s3_access_key_id": S3["s3_access_key_id"]})
    assert run.error is not None and "vllm-cluster:s3_secret_access_key" in str(run.error)
    assert "plain-text-secret-key-123" not in str(run.error) and run.mocks.resources == []


def _inputs(run: Run) -> dict[str, dict[str, Any]]:
    return {r.name: r.inputs for r in run.mocks.resources}


def _changed(a: Run, b: Run) -> set[str]:
    ia, ib = _inputs(a), _inputs(b)
    assert set(ia) == set(ib)
    return {n for n in ia if ia[n] != ib[n]}


def test_what_a_source_change_re_runs_and_replaces(synced: Run) -> None:
    moved = run_program("prod", with_source(url=SOURCE["url"] + "-v2"), secrets={**SECRET_VALUES, **S3},
                        stdout={"node1-weights": verdict("weights-node1", HASH_A),
                                "node2-weights": verdict("weights-node2", HASH_B)})
    changed = _changed(synced, moved)
    engines = {"engine-node1-deepseek-v41-flash", "engine-node2-deepseek-v41-flash"}
    assert {"node1-weights", "node2-weights"} <= changed and engines <= changed  # another checkpoint: new group
    assert {"api-health", "api-smoke"} <= changed  # the checks re-run against it
    assert not any(n.endswith(("-image", "-docker")) for n in changed)
    tuned = run_program("prod", with_source(workers=48), secrets={**SECRET_VALUES, **S3},
                        stdout={"node1-weights": verdict("weights-node1", HASH_A),
                                "node2-weights": verdict("weights-node2", HASH_B)})
    changed = _changed(synced, tuned)
    assert {"node1-weights", "node2-weights"} <= changed and not changed & engines  # how it travels only
    assert synced.mocks.named("node1-weights").inputs["triggers"][1] == synced.outputs["image"]


# --- collective ------------------------------------------------------------------------------------------------------

def test_collective_commands_per_node_triggers_and_what_changes_them(local: Run) -> None:
    engine = local.result["engine"]
    for rank, name in enumerate(("node1", "node2")):
        inputs = local.mocks.named(f"collective-{name}").inputs
        create = inputs["create"]
        assert f"--node-rank {rank} " in create and "--min-busbw-gbps 50 " in create
        assert "docker stop --time 30 deepseek-v41-flash" in create and engine.generation not in create
        assert inputs["triggers"][0] == local.outputs["image"] and inputs["triggers"][2] == "min_busbw_gbps=50"
        assert inputs["triggers"] == local.mocks.named("collective-node1").inputs["triggers"]  # one group
    floor = copy.deepcopy(read_stack_values("prod"))
    floor["fabric"]["min_busbw_gbps"] = 400
    changed = _changed(local, run_program("prod", floor, stdout={
        "node1-weights": verdict("weights-node1", HASH_A), "node2-weights": verdict("weights-node2", HASH_A)}))
    assert {"collective-node1", "collective-node2"} <= changed
    assert not any(n.startswith("engine-") and n.endswith("-flash") for n in changed)  # the guard skips then
    hca = copy.deepcopy(read_stack_values("prod"))
    hca["nodes"][1]["hcas"] = ["mlx5_0:1", "mlx5_3:1"]
    changed = _changed(local, run_program("prod", hca, stdout={
        "node1-weights": verdict("weights-node1", HASH_A), "node2-weights": verdict("weights-node2", HASH_A)}))
    # node2's fabric env changed: node1 must run too (a node alone cannot all-reduce), and the group is replaced
    assert {"collective-node1", "collective-node2", "engine-node1-deepseek-v41-flash"} <= changed
    seqs = copy.deepcopy(read_stack_values("prod"))
    seqs["serving"]["max_num_seqs"] = 64
    changed = _changed(local, run_program("prod", seqs, stdout={
        "node1-weights": verdict("weights-node1", HASH_A), "node2-weights": verdict("weights-node2", HASH_A)}))
    # a launch change replaces the group without measuring the fabric again
    assert "engine-node1-deepseek-v41-flash" in changed and not any(n.startswith("collective-") for n in changed)


def test_ray_stack_gets_collectives_before_its_containers_too() -> None:
    run = run_program("h20")
    assert run.error is None, run.error
    collectives = run.result["collectives"]
    assert set(collectives) == {"h20-1", "h20-2"}
    for container in run.result["engine"].containers.values():
        assert all(waits_for(run, container, c) for c in collectives.values())
    assert "--backend nccl --transport roce" in run.mocks.named("collective-h20-2").inputs["create"]


# --- golden per rank, through the proxy, and the proxy's label -------------------------------------------------------

def test_api_checks_run_every_rank_with_the_stacks_golden_set() -> None:
    values = copy.deepcopy(read_stack_values("prod"))
    golden = [{"prompt": "17*19等于多少？只返回数字。", "expect": "323"}, {"prompt": "capital of France?",
                                                                    "expect": "(?i)paris"}]
    values["api"] = {"smoke": {"golden": golden}}
    run = run_program("prod", values)
    argv = shlex.split(run.mocks.named("api-smoke").inputs["create"])
    assert argv[argv.index("--sections") + 1] == "models,chat,thinking,stream,auth"  # the harness sets api_key
    assert argv[argv.index("--dp-size") + 1] == "2" and argv[argv.index("--rank-nodes") + 1] == "node1,node2"
    assert json.loads(argv[argv.index("--golden-json") + 1]) == golden
    watch = copy.deepcopy(values)
    watch["api"]["watch_interval_s"] = 600
    assert _changed(run, run_program("prod", watch)) == set()  # the watch unit's interval is no deploy input


def test_the_proxy_container_carries_the_stack_label() -> None:
    from tests.test_program_proxy import SECRETS, proxied_values

    run = run_program("prod", proxied_values("prod"), secrets=SECRETS)
    assert run.error is None, run.error
    proxy = run.mocks.named("api-proxy")
    assert proxy.typ == CONTAINER
    assert {"label": "vllm-cluster.stack", "value": "prod"} in unwrap(proxy.inputs["labels"])
    pre = run.mocks.named("node1-pre-pull").inputs["create"]
    assert "--owned-label vllm-cluster.stack=prod --container-names deepseek-v41-flash,vllm-proxy " in pre
    assert "role=api-proxy" not in pre

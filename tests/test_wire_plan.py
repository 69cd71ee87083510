"""The wiring of the golden set, the collective check and the weights into the config and the plan (pure): which
checks the plan lists, in which order, with which arguments, and the `watch-unit` subcommand."""

from __future__ import annotations

import copy
import itertools
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import checks.collective
import checks.preflight
from checks.api import main as api_main
from components.check_commands import api_command, collective_command, preflight_command, weights_command
from stacks.model.errors import ConfigError
from stacks.model.field_types import SECRET
from stacks.model.loader import parse_config
from stacks.planner.container_spec import LABEL_PREFIX
from stacks.planner.launch import group_generation
from stacks.planner.plan import (
    AFTER_PULL,
    BEFORE_PULL,
    DEFAULT_MIN_BUSBW_GBPS,
    WEIGHTS_LABEL,
    api_sections,
    build_plan,
    weights_identity,
)
from tests.conftest import ROOT, clone_node, plan_of

SOURCE = {"url": "s3://team-weights/deepseek/DeepSeek-V4.1-Flash", "endpoint_url": "https://minio.internal:9000",
          "region": "us-east-1"}
ANALYZE = shutil.which("systemd-analyze") or "/usr/bin/systemd-analyze"


def names(values: dict[str, Any], module: str | None = None) -> list[str]:
    return [c.name for c in plan_of(values).checks if module is None or c.module == module]


def one_node(h20_values: dict[str, Any]) -> dict[str, Any]:
    """h20's V4-Flash on its first node alone: TP8, mp."""
    h20_values["nodes"] = h20_values["nodes"][:1]
    h20_values["parallelism"] |= {"pipeline": 1, "backend": "mp"}
    return h20_values


# --- the constants stacks/ keeps so it can plan without checks/ beside it --------------------------------------

def test_planner_constants_equal_the_checks_own() -> None:
    assert (BEFORE_PULL, AFTER_PULL) == (checks.preflight.BEFORE_PULL, checks.preflight.AFTER_PULL)
    assert DEFAULT_MIN_BUSBW_GBPS == checks.collective.DEFAULT_MIN_BUSBW_GBPS


# --- node checks: weights, the preflight split, their order ----------------------------------------------------

def test_without_a_source_the_weights_are_verified_before_the_pre_pull_preflight(prod_values: dict[str, Any]) -> None:
    plan = plan_of(prod_values, "prod")
    node1 = [c for c in plan.checks if c.node == "node1" and c.runs_on == "node"
             and c.module in ("checks.weights", "checks.preflight")]
    assert [(c.name, c.sections) for c in node1] == [
        ("weights-node1", ["verify"]), ("pre-pull-node1", ["ownership", "disk", "gpu", "model"]),
        ("preflight-node1", ["toolkit", "memlock"]), ("fabric-node1", ["infiniband", "hca", "sysctl"])]  # no gid_index
    config = parse_config("prod", prod_values)
    check = next(c for c in plan.checks if c.name == "weights-node1")
    command = weights_command(config, plan, check)
    first = command.splitlines()[0]
    # the node's own python3, as every host preflight; the directory the engines mount, read only by the check
    assert first == ("timeout 3600 python3 - verify --dest /mnt/disk2/modelscope/models/deepseek-ai/DeepSeek-V4.1-"
                     "Flash --name weights-node1 --content --json <<'VLLM_CLUSTER_WEIGHTS_EOF'")
    assert "docker" not in first


def test_with_a_source_the_sync_runs_after_the_pull_and_model_after_it(prod_values: dict[str, Any]) -> None:
    prod_values["model"]["source"] = SOURCE
    plan = plan_of(prod_values, "prod")
    node2 = [(c.name, c.sections) for c in plan.checks if c.node == "node2" and c.module in
             ("checks.weights", "checks.preflight")]
    assert node2[:3] == [("pre-pull-node2", ["ownership", "disk", "gpu"]), ("weights-node2", ["sync"]),
                         ("preflight-node2", ["model", "toolkit", "memlock"])]
    config = parse_config("prod", prod_values)
    command = weights_command(config, plan, next(c for c in plan.checks if c.name == "weights-node2"))
    head = shlex.split(command.split("\n")[1].split("<<")[0])  # line 1 reads credentials from stdin
    assert head[:3] == ["timeout", "21600", "docker"]
    assert head[head.index("--pull") + 1] == "never"  # RemoteImage pulled it; the sync never pulls on its own
    assert head[head.index("--entrypoint") + 1:head.index("--entrypoint") + 3] == ["python3", config.image.pull_ref]
    args = head[head.index("-") + 1:]
    assert args[:5] == ["sync", "--source", SOURCE["url"], "--dest", config.model.host_path]
    for flag, value in (("--endpoint-url", SOURCE["endpoint_url"]), ("--region", "us-east-1"), ("--workers", "16"),
                        ("--part-size-mb", "256"), ("--name", "weights-node2")):
        assert args[args.index(flag) + 1] == value
    assert "--delete" not in args and "--json" in args and "--content" in args  # weights-match compares bytes
    pairs = list(itertools.pairwise(head))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        assert ("-e", name) in pairs  # copied by name from the environment line 1 read from stdin: no value here
    # the model section still gets everything it reads, now after the pull
    post = preflight_command(config, plan, next(c for c in plan.checks if c.name == "preflight-node2"))
    assert "--sections model,toolkit,memlock" in post and "--model-dir " + config.model.host_path in post


def test_the_pre_pull_preflight_owns_by_the_stack_label_only(prod_values: dict[str, Any]) -> None:
    prod_values["api"] = {"proxy": {"enabled": True, "server_name": "llm.example"}}
    prod_values["serving"]["host"] = "127.0.0.1"
    prod_values |= {"api_key": SECRET, "proxy_keys": {"team-a": SECRET}, "tls_certificate": SECRET,
                    "tls_private_key": SECRET}
    config = parse_config("prod", prod_values)
    plan = build_plan("prod", config)
    command = preflight_command(config, plan, next(c for c in plan.checks if c.name == "pre-pull-node1"))
    args = shlex.split(command.split("<<")[0])
    assert args.count("--owned-label") == 1 and args[args.index("--owned-label") + 1] == "vllm-cluster.stack=prod"
    assert "role=api-proxy" not in command
    assert args[args.index("--container-names") + 1] == "deepseek-v41-flash,vllm-proxy"
    assert "29700" in args[args.index("--ports") + 1].split(",")  # the collective check's rendezvous port


def test_weights_match_and_collective_only_with_more_than_one_node(prod_values: dict[str, Any],
                                                                  h20_values: dict[str, Any]) -> None:
    assert names(copy.deepcopy(prod_values), "checks.collective") == ["collective-node1", "collective-node2"]
    assert names(copy.deepcopy(prod_values), "checks.weights_match") == ["weights-match"]
    single = plan_of(one_node(h20_values))
    assert not [c for c in single.checks if c.module in ("checks.collective", "checks.weights_match")]
    assert not [x for x in single.listeners if x.port == 29700]
    assert [c.name for c in single.checks if c.module == "checks.weights"] == ["weights-h20-1"]
    assert not any("--parallel" in n for n in single.notes)


def test_n_nodes_get_one_collective_each_with_their_rank(prod_values: dict[str, Any]) -> None:
    prod_values["nodes"] = [clone_node(prod_values["nodes"][0], i) for i in range(4)]
    prod_values["parallelism"]["data"] = 4
    config = parse_config("t", prod_values)
    plan = build_plan("t", config)
    collectives = [c for c in plan.checks if c.module == "checks.collective"]
    assert [c.node for c in collectives] == ["node1", "node2", "node3", "node4"]
    for rank, check in enumerate(collectives):
        args = shlex.split(collective_command(config, plan, check).split("<<")[0].splitlines()[-1])
        tail = args[args.index("-") + 1:]
        assert tail[tail.index("--node-rank") + 1] == str(rank) and tail[tail.index("--nnodes") + 1] == "4"
        assert tail[tail.index("--master-addr") + 1] == config.nodes[0].data_ips[0]
    assert any("--parallel must be at least 4" in n for n in plan.notes)


# --- the collective check's command and its port ---------------------------------------------------------------

def test_collective_command_floor_port_label_and_engine_guard(prod_values: dict[str, Any]) -> None:
    prod_values["fabric"] |= {"min_busbw_gbps": 400, "collective_port": 29777}
    config = parse_config("prod", prod_values)
    plan = build_plan("prod", config)
    command = collective_command(config, plan, next(c for c in plan.checks if c.name == "collective-node2"))
    guard, run = command.split("esac\n", 1)
    assert "docker container inspect --format" in guard and "  'prod true '*)" in guard
    assert f"docker image inspect --format '{{{{.Id}}}}' {config.image.pull_ref}" in guard
    assert "NCCL_IB_HCA==mlx5_0:1,mlx5_2:1 " in guard and "VLLM_HOST_IP=1.1.1.1 " in guard  # node2's own values
    assert "docker stop --time 30 deepseek-v41-flash" in guard and "echo 'SKIP collective-node2:" in guard
    generation = plan.node("node2").containers[0].labels[f"{LABEL_PREFIX}.generation"]
    assert generation not in command  # a launch change alone does not re-run the check
    head = shlex.split(run.split("<<")[0])
    assert head[:4] == ["timeout", "900", "docker", "run"]
    assert head[head.index("--label") + 1] == "vllm-cluster.stack=prod"
    tail = head[head.index("-") + 1:]
    assert tail[tail.index("--min-busbw-gbps") + 1] == "400" and tail[tail.index("--master-port") + 1] == "29777"
    assert [x.port for x in plan.listeners if "collective" in x.purpose] == [29777]
    del prod_values["fabric"]["min_busbw_gbps"]
    config = parse_config("prod", prod_values)
    plan = build_plan("prod", config)
    default = collective_command(config, plan, next(c for c in plan.checks if c.name == "collective-node1"))
    assert "--min-busbw-gbps 50 " in default  # roce's documented default, written out


def test_collective_runs_with_the_engines_values_overrides_included(prod_values: dict[str, Any]) -> None:
    prod_values["container"]["managed_env_overrides"] = {"NCCL_IB_HCA": "=mlx5_4:1"}
    config = parse_config("prod", prod_values)
    plan = build_plan("prod", config)
    assert plan.node("node1").containers[0].env["NCCL_IB_HCA"] == "=mlx5_4:1"
    command = collective_command(config, plan, next(c for c in plan.checks if c.name == "collective-node1"))
    assert "-e NCCL_IB_HCA==mlx5_4:1 " in command and "NCCL_IB_HCA==mlx5_4:1 " in command.split("esac")[0]
    assert "mlx5_0:1" not in command.split("<<")[0]


@pytest.mark.parametrize(("stack", "port", "clash"), [
    ("prod", 8030, "serving.port"), ("prod", 13399, "parallelism.data_parallel_rpc_port"), ("prod", 22, "sshd"),
    ("h20", 6379, "ray.gcs_port"), ("h20", 15000, "Ray worker and driver gRPC"),
])
def test_collective_port_clashes_are_refused(stack: str, port: int, clash: str, prod_values: dict[str, Any],
                                             h20_values: dict[str, Any]) -> None:
    values = prod_values if stack == "prod" else h20_values
    values["fabric"]["collective_port"] = port
    with pytest.raises(ConfigError) as info:
        plan_of(values)
    found = [p for p in info.value.problems if p.key == "fabric.collective_port"]
    assert found and clash in found[0].message and found[0].fix, info.value.report()


# --- golden checks per DP rank -----------------------------------------------------------------------------------

def test_one_golden_check_per_dp_rank_through_the_endpoint(prod_values: dict[str, Any]) -> None:
    golden = [{"prompt": "17*19等于多少？只返回数字。", "expect": "323"}, {"prompt": "2+2=?", "expect": r"4|four"},
              {"prompt": "line one\nline two", "expect": ".*ok.*"}]
    prod_values["api"] = {"smoke": {"golden": golden, "stream_check": False}}
    config = parse_config("prod", prod_values)
    plan = build_plan("prod", config)
    ranked = [c for c in plan.checks if c.name.startswith("api-golden")]
    assert [(c.name, c.sections, c.runs_on) for c in ranked] == [
        ("api-golden-rank-0", ["chat", "thinking"], "deployer"), ("api-golden-rank-1", ["chat", "thinking"],
                                                                   "deployer")]
    assert "DP rank 1 on node2 (X-data-parallel-rank: 1) answers 3 golden pair(s)" in ranked[1].proves
    assert api_sections(plan) == ["health", "models", "chat", "thinking"]
    argv = shlex.split(api_command(config, plan, ["chat", "thinking"], "api-smoke"))
    assert argv[argv.index("--dp-size") + 1] == "2" and argv[argv.index("--rank-nodes") + 1] == "node1,node2"
    assert json.loads(argv[argv.index("--golden-json") + 1]) == golden
    assert "--prompt" not in argv and "--expect" not in argv


def test_planned_golden_arguments_parse_in_checks_api(prod_values: dict[str, Any], capsys: Any) -> None:
    """The words the program registers are accepted by checks.api's own parser (a bad rank list or golden JSON
    would be exit 2 before any request): nothing listens on the URL, so health fails, not the arguments."""
    prod_values["api"] = {"smoke": {"golden": [{"prompt": 'say "$HOME" 100%', "expect": r"^\d+$"}]},
                          "request_timeout_s": 1, "public_host": "127.0.0.1"}
    prod_values["serving"]["port"] = 9
    config = parse_config("prod", prod_values)
    plan = build_plan("prod", config)
    argv = shlex.split(api_command(config, plan, ["health"], "api-health"))[3:]
    argv[argv.index("--deadline-s") + 1] = "0.2"
    assert api_main(argv) == 1
    assert "bad argument" not in capsys.readouterr().out


def test_ray_and_dp1_get_one_unpinned_golden_check(h20_values: dict[str, Any]) -> None:
    config = parse_config("h20", h20_values)
    plan = build_plan("h20", config)
    assert [c.name for c in plan.checks if c.name.startswith("api-golden")] == ["api-golden"]
    argv = shlex.split(api_command(config, plan, ["chat"], "api-smoke"))
    assert argv[argv.index("--dp-size") + 1] == "1" and "--rank-nodes" not in argv


# --- the weights identity replaces the group; nothing changes without a source -----------------------------------

def test_a_source_change_replaces_the_whole_group_and_no_source_changes_nothing(prod_values: dict[str, Any]) -> None:
    from stacks.planner.launch import engine_containers
    from stacks.planner.model_cards import get_profile
    from stacks.planner.topology import derive_topology

    config = parse_config("prod", prod_values)
    topo, _ = derive_topology(config)
    profile = get_profile(config.model.profile)
    assert profile is not None
    launch = group_generation({n: s[0] for n, s in engine_containers("prod", config, profile, topo).items()})
    plain = plan_of(copy.deepcopy(prod_values), "prod")
    assert {n.containers[0].labels[f"{LABEL_PREFIX}.generation"] for n in plain.nodes} == {launch}
    assert WEIGHTS_LABEL not in plain.nodes[0].containers[0].labels and weights_identity(config) is None

    def generations(source: dict[str, Any]) -> set[tuple[str, str]]:
        values = copy.deepcopy(prod_values)
        values["model"]["source"] = source
        plan = plan_of(values, "prod")
        return {(n.containers[0].labels[f"{LABEL_PREFIX}.generation"], n.containers[0].labels[WEIGHTS_LABEL])
                for n in plan.nodes}

    a, b = generations(SOURCE), generations(SOURCE | {"url": SOURCE["url"] + "-v2"})
    assert len(a) == len(b) == 1 and a != b and launch not in {g for g, _ in a | b}
    assert generations(SOURCE | {"workers": 64, "delete": True, "timeout_s": 3600}) == a  # how, not which bytes
    assert generations(SOURCE["url"]) != a  # the endpoint is part of which bytes


def test_source_notes_and_credential_rules(prod_values: dict[str, Any]) -> None:
    prod_values["model"]["source"] = SOURCE["url"]
    assert any("instance role" in n for n in plan_of(copy.deepcopy(prod_values)).notes)
    keyed = copy.deepcopy(prod_values) | {"s3_access_key_id": SECRET, "s3_secret_access_key": SECRET}
    assert not any("instance role" in n for n in plan_of(keyed).notes)
    for only, missing in (({"s3_access_key_id": SECRET}, "s3_secret_access_key"),
                          ({"s3_secret_access_key": SECRET}, "s3_access_key_id"),
                          ({"s3_session_token": SECRET}, "s3_session_token")):
        with pytest.raises(ConfigError) as info:
            plan_of(copy.deepcopy(prod_values) | only)
        assert missing in [p.key for p in info.value.problems], info.value.report()
    del prod_values["model"]["source"]
    unused = plan_of(prod_values | {"s3_access_key_id": SECRET, "s3_secret_access_key": SECRET})
    assert any("nothing uses them" in w for w in unused.warnings)


@settings(max_examples=300, deadline=None)
@given(url=st.one_of(st.text(max_size=80), st.from_regex(r"s3://[a-z0-9.\-_]{0,70}(/[ -~]{0,40}){0,3}",
                                                         fullmatch=True)),
       endpoint=st.one_of(st.none(), st.text(max_size=60), st.from_regex(r"https?://[ -~]{0,40}", fullmatch=True)),
       pattern=st.text(max_size=40), prompt=st.text(max_size=30))
def test_fuzzed_sources_and_golden_pairs_end_in_a_plan_or_named_problems(url: str, endpoint: str | None,
                                                                         pattern: str, prompt: str) -> None:
    from stacks.model.loader import read_stack_values

    values = copy.deepcopy(read_stack_values("prod"))
    values["model"]["source"] = {"url": url} | ({"endpoint_url": endpoint} if endpoint is not None else {})
    values["api"] = {"smoke": {"golden": [{"prompt": prompt, "expect": pattern}]}}
    try:
        plan_of(values)
    except ConfigError as exc:
        assert exc.problems and all(p.key.startswith(("model.source", "api.smoke")) and p.fix
                                    for p in exc.problems), exc.report()


# --- python -m stacks watch-unit -----------------------------------------------------------------------------------

def stacks_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stacks", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_watch_unit_for_prod_verifies_and_carries_the_stack(tmp_path: Path) -> None:
    done = stacks_cli("watch-unit", "prod", "--python", sys.executable)
    assert done.returncode == 0, done.stderr
    path = tmp_path / "vllm-cluster-watch-prod.service"
    path.write_text(done.stdout)
    verify = subprocess.run([ANALYZE, "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0, verify.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("ExecStart="))
    assert f"WorkingDirectory={ROOT}" in done.stdout and line.startswith(f"ExecStart={sys.executable} -m checks.api")
    for part in ("--url http://10.30.8.1:8030", "--served-name DeepSeek-V4.1-Flash", "--dp-size 2",
                 "--rank-nodes node1,node2", "--interval-s 60", "--timeout-s 300"):
        assert part in line, part
    assert "EnvironmentFile" not in done.stdout and "--ca-file" not in line  # prod: no key, no proxy
    assert "systemctl enable --now vllm-cluster-watch-prod.service" in done.stderr


def test_watch_unit_with_the_proxy_key_file_ca_and_settings() -> None:
    done = stacks_cli("watch-unit", "prod", "--set", "api.proxy.enabled=true", "--set", "serving.host=127.0.0.1",
                      "--set", "api.proxy.server_name=llm.example", "--set", "api.watch_interval_s=15",
                      "--assume-secret", "api_key", "--assume-secret", "proxy_keys.team-a",
                      "--assume-secret", "tls_certificate", "--assume-secret", "tls_private_key")
    assert done.returncode == 0, done.stderr
    assert "EnvironmentFile=/etc/vllm-cluster/prod-watch.env" in done.stdout
    line = next(x for x in done.stdout.splitlines() if x.startswith("ExecStart="))
    assert "--url https://llm.example:443" in line and "--ca-file /etc/vllm-cluster/prod-ca.pem" in line
    assert "--interval-s 15" in line
    assert "proxy_keys.team-a" in done.stderr and "tls_certificate > /etc/vllm-cluster/prod-ca.pem" in done.stderr


def test_watch_unit_refuses_bad_input_with_exit_2() -> None:
    relative = stacks_cli("watch-unit", "prod", "--workdir", "relative/dir")
    assert relative.returncode == 2 and "must be an absolute path" in relative.stderr and not relative.stdout
    bad = stacks_cli("watch-unit", "prod", "--set", "api.watch_interval_s=5")
    assert bad.returncode == 2 and "vllm-cluster:api.watch_interval_s = 5" in bad.stderr
    assert "Traceback" not in relative.stderr + bad.stderr


def test_plan_says_how_to_get_the_watch_unit() -> None:
    done = stacks_cli("plan", "prod")
    assert done.returncode == 0 and "venv/bin/python -m stacks watch-unit prod" in done.stdout

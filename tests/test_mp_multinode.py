"""vLLM's own multi-node executor (`backend: mp`, a replica of TP x PP spanning nodes, no Ray).

Golden argv are typed from seed 001's flags plus vLLM 0.33.0's multi-node flags (engine/arg_utils.py:1175-1178),
not produced by the code under test. Every argv is parsed by the captured 0.33.0 flag table (the stand-in in
tests/vllm_standin), the dry run runs in a real Docker engine, and the Pulumi program runs under mocks.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checks.bundle import heredoc_command
from checks.engines import classify as engines
from components.check_commands import dry_run_command, engines_command
from stacks.model.errors import ConfigError, Problem
from stacks.model.field_types import SECRET
from stacks.model.loader import parse_config, read_stack_values
from stacks.planner import validation
from stacks.planner.managed_options import ELASTIC_EP_MULTINODE_ERROR
from stacks.planner.model_cards import get_profile
from stacks.planner.plan import Plan, build_plan
from stacks.planner.render import render_plan
from stacks.planner.validation import DSPARK_PP_ERROR
from tests.conftest import ROOT, clone_node, flag_pairs, plan_of, problems_of
from tests.docker_harness import RUN, build_image, docker_ready, remove_image, renamed_flag, run_shell, standin_env
from tests.pulumi_harness import Run, run_program, waits_for

V4 = "/data/models/DeepSeek-V4-Flash"
# Seed 001's serving flags, in the order vllm_args emits them (see tests/test_plan_golden.py for h20 on Ray).
V4_TAIL = [
    ("--enable-expert-parallel", None), ("--max-model-len", "65536"), ("--max-num-seqs", "8"),
    ("--gpu-memory-utilization", "0.88"), ("--kv-cache-dtype", "fp8"), ("--tokenizer-mode", "deepseek_v4"),
    ("--tool-call-parser", "deepseek_v4"), ("--enable-auto-tool-choice", None), ("--reasoning-parser", "deepseek_v4"),
]
V4_HEAD = [("--served-model-name", "DeepSeek-V4-Flash"), ("--trust-remote-code", None), ("--dtype", "auto"),
           ("--tensor-parallel-size", "8"), ("--pipeline-parallel-size", "2"),
           ("--distributed-executor-backend", "mp")]


def nnodes(n: int, rank: int) -> list[tuple[str, str | None]]:
    return [("--nnodes", str(n)), ("--node-rank", str(rank)), ("--master-addr", "192.0.2.11"),
            ("--master-port", "29501")]


DP2 = [("--data-parallel-size", "2"), ("--data-parallel-size-local", "1"), ("--data-parallel-address", "192.0.2.11"),
       ("--data-parallel-rpc-port", "29550"), ("--data-parallel-backend", "mp")]

GOLDEN_2 = {  # h20's TP8 x PP2 on mp: one replica over two nodes
    "h20-1": [("--host", "0.0.0.0"), ("--port", "8000"), *V4_HEAD, *nnodes(2, 0), *V4_TAIL],
    "h20-2": [("--headless", None), *V4_HEAD, *nnodes(2, 1), *V4_TAIL],
}
GOLDEN_4 = {  # DP2 x (TP8 x PP2) over four nodes: replica 0 on h20-1/2, replica 1 on h20-3/4
    "h20-1": [("--host", "0.0.0.0"), ("--port", "8000"), *V4_HEAD, *nnodes(4, 0), *DP2, *V4_TAIL],
    "h20-2": [("--headless", None), *V4_HEAD, *nnodes(4, 1), *DP2, *V4_TAIL],
    "h20-3": [("--headless", None), *V4_HEAD, *nnodes(4, 2), *DP2, *V4_TAIL],
    "h20-4": [("--headless", None), *V4_HEAD, *nnodes(4, 3), *DP2, *V4_TAIL],
}


def h20_mp(values: dict[str, Any], nodes: int = 2, data: int = 1) -> dict[str, Any]:
    """Seed 001's stack on `mp`, optionally with more nodes (h20-3, h20-4, … with their own addresses)."""
    values = copy.deepcopy(values)
    values["parallelism"] |= {"backend": "mp", "data": data}
    for i in range(len(values["nodes"]), nodes):
        node = copy.deepcopy(values["nodes"][1])
        node["name"] = f"h20-{i + 1}"
        node["ssh"]["host"] = node["management_ip"] = f"192.0.2.{11 + i}"
        node["data_ips"] = [f"198.51.100.{(i + 1) * 10 + k}" for k in range(1, 5)]
        values["nodes"].append(node)
    return values


def args_of(plan: Plan, node: str) -> list[str]:
    return plan.node(node).containers[0].vllm_args or []


# --- golden argv, topology, env, listeners, checks -----------------------------------------------------------


def test_two_node_replica_golden_argv_and_layout(h20_values: dict[str, Any]) -> None:
    plan = plan_of(h20_mp(h20_values))
    assert plan.topology["backend"] == "mp" and plan.topology["replica_nodes"] == 2
    assert [(n.name, n.role, n.node_rank, n.replica, n.dp_ranks, n.gpus_used) for n in plan.nodes] == [
        ("h20-1", "mp-head", 0, 0, [0], 8), ("h20-2", "mp-worker", 1, 0, [], 8)]
    assert plan.start_order == ["h20-2", "h20-1"]  # headless first; the head hosts what they dial
    for name, golden in GOLDEN_2.items():
        args = args_of(plan, name)
        assert args[0] == V4 and flag_pairs(args[1:]) == golden, name
    assert all(n.dp_start_rank is None for n in plan.nodes)


def test_four_node_dp2_golden_argv_and_layout(h20_values: dict[str, Any]) -> None:
    plan = plan_of(h20_mp(h20_values, nodes=4, data=2))
    assert plan.topology | {"gpus_per_node": None} == {
        "backend": "mp", "nodes": 4, "gpus_per_node": None, "gpus_used": 32, "tensor": 8, "pipeline": 2, "data": 2,
        "expert": 16, "label": "mp-dp2-tp8-pp2-ep16", "replica_nodes": 2}
    assert [(n.role, n.node_rank, n.replica, n.dp_ranks) for n in plan.nodes] == [
        ("mp-head", 0, 0, [0]), ("mp-worker", 1, 0, []), ("mp-replica-head", 2, 1, [1]), ("mp-worker", 3, 1, [])]
    assert plan.start_order == ["h20-2", "h20-3", "h20-4", "h20-1"]
    for name, golden in GOLDEN_4.items():
        args = args_of(plan, name)
        assert args[0] == V4 and flag_pairs(args[1:]) == golden, name
        assert "--data-parallel-start-rank" not in args  # vLLM infers the DP rank from --node-rank
    assert any("up to 16 active sequences" in n for n in plan.notes)
    text = render_plan(plan)
    assert "mp-replica-head" in text and "1  (node-rank 2, replica 1)" in text


def test_env_secrets_and_healthcheck_per_role(h20_values: dict[str, Any]) -> None:
    values = h20_mp(h20_values, nodes=4, data=2)
    values["api_key"] = SECRET
    plan = plan_of(values)
    for i, node in enumerate(plan.nodes):
        spec = node.containers[0]
        assert spec.env["VLLM_HOST_IP"] == f"192.0.2.{11 + i}"  # its own control-plane IP (ZMQ queues bind it)
        assert spec.env["GLOO_SOCKET_IFNAME"] == "bond0" and spec.env["NCCL_IB_GID_INDEX"] == "3"
        assert ("VLLM_API_KEY" in spec.secret_env) == (i == 0) and (spec.healthcheck is not None) == (i == 0)
        assert "VLLM_API_KEY" not in spec.env
        assert spec.entrypoint is None and spec.command == spec.vllm_args  # the image's `vllm serve`
        assert spec.labels["vllm-cluster.role"] == node.role
    assert len({n.containers[0].labels["vllm-cluster.generation"] for n in plan.nodes}) == 1


def test_master_port_listener_and_its_warning(h20_values: dict[str, Any], prod_values: dict[str, Any]) -> None:
    plan = plan_of(h20_mp(h20_values))
    master = [x for x in plan.listeners if x.port == 29501]
    assert len(master) == 1 and master[0].node == "h20-1"
    # torch's TCPStore binds every address (IPv6 included); the host firewall is what keeps it to the cluster
    assert master[0].bind == "::" and master[0].network == "all" and not master[0].public
    assert "29501" in ",".join(plan.firewall.nodes[0].internal_ports)
    unfiltered = h20_mp(h20_values) | {"firewall": {"enabled": False}}
    unfiltered["serving"] = unfiltered["serving"] | {"host": "192.0.2.11"}  # vLLM's own port stays private
    open_plan = plan_of(unfiltered)
    assert [x.public for x in open_plan.listeners if x.port == 29501] == [True]
    assert any("firewall.enabled is false" in w and "h20-1:29501" in w for w in open_plan.warnings)
    assert not [x for x in plan_of(prod_values).listeners if x.port == 29501]
    assert not [x for x in plan_of(h20_values).listeners if x.port == 29501]


def test_checks_engine_evidence_per_node_no_ray(h20_values: dict[str, Any]) -> None:
    values = h20_mp(h20_values, nodes=4, data=2)
    config = parse_config("t", values)
    plan = build_plan("t", config)
    names = [c.name for c in plan.checks]
    assert "ray-cluster" not in names
    assert [c.name for c in plan.checks if c.module == "checks.engines"] == [f"engines-h20-{i}" for i in range(1, 5)]
    assert [c.name for c in plan.checks if c.module == "checks.nccl_transport"] == [
        f"nccl-transport-h20-{i}" for i in range(1, 5)]  # every node's workers log their own NCCL lines
    evidence = {c.node: engines_command(plan, c).splitlines()[0] for c in plan.checks if c.module == "checks.engines"}
    assert "--ranks 0 --workers 8 <<" in evidence["h20-1"]
    assert "--ranks '' --workers 8 <<" in evidence["h20-2"]
    assert "--ranks 1 --workers 8 <<" in evidence["h20-3"]
    dry = {c.node: dry_run_command(config, plan, c).splitlines()[0] for c in plan.checks
           if c.module == "checks.vllm_args"}
    assert "--expect nnodes=4 --expect node_rank=2 --expect master_addr=192.0.2.11 --expect master_port=29501" in (
        dry["h20-3"])


@st.composite
def spanning(draw: st.DrawFn) -> dict[str, Any]:
    """h20 on mp with g GPUs per node, DP replicas of TP x PP over about N / DP nodes (sometimes not whole)."""
    values = h20_mp(read_stack_values("h20"))
    gpus, per_replica, data = draw(st.sampled_from([2, 4, 8])), draw(st.integers(2, 4)), draw(st.integers(1, 3))
    nodes = per_replica * data + draw(st.sampled_from([0, 0, 0, 1, -1]))
    tensor = draw(st.sampled_from([t for t in (1, 2, 4, 8) if t <= gpus * per_replica]))
    pipeline = draw(st.sampled_from([max(1, gpus * per_replica // tensor), per_replica, 2]))
    values = h20_mp(values, nodes=max(nodes, 2), data=data)
    values["parallelism"] |= {"tensor": tensor, "pipeline": pipeline, "expert": False}
    values["model"]["weights_gb"] = 10
    for node in values["nodes"]:
        node["gpus"]["count"] = gpus
    return values


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spanning())
def test_layout_matches_vllms_own_arithmetic(values: dict[str, Any]) -> None:
    """Each accepted plan against vLLM 0.33.0's formulas, written out from the source: world = DP x TP x PP,
    local = world / N, DP rank = node_rank x local // (TP x PP) (engine/arg_utils.py:2399-2424), nnodes_within_dp
    = N / DP and node_rank_within_dp = node_rank % that (config/parallel.py:808-836)."""
    par = values["parallelism"]
    n, dp, per_replica = len(values["nodes"]), par["data"], par["tensor"] * par["pipeline"]
    world = per_replica * dp
    try:
        plan = build_plan("prop", parse_config("prop", values))
    except ConfigError as exc:
        keys = {p.key for p in exc.problems}
        spans = n > dp and per_replica > values["nodes"][0]["gpus"]["count"]
        if spans and world % n:
            assert "parallelism.pipeline" in keys
        if spans and n % dp:
            assert "parallelism.data" in keys
        return
    if plan.topology["replica_nodes"] == 1:
        assert per_replica <= values["nodes"][0]["gpus"]["count"] or n <= dp
        return
    local, within = world // n, n // dp
    assert world % n == 0 and n % dp == 0 and plan.topology["replica_nodes"] == within
    for rank, node in enumerate(plan.nodes):
        assert node.node_rank == rank and node.gpus_used == local
        assert node.replica == rank * local // per_replica
        first = rank % within == 0
        assert node.dp_ranks == ([node.replica] if first else [])
        assert node.role == ("mp-head" if rank == 0 else "mp-replica-head" if first else "mp-worker")
    assert plan.start_order[-1] == plan.head.name


# --- rules: the upstream refusals, and every per-replica rule with the same key / value / fix ----------------


def _only(problems: list[Problem], key: str) -> Problem:
    matching = [p for p in problems if p.key == key]
    assert matching, f"no problem for {key}: {[p.render() for p in problems]}"
    return matching[0]


def test_nodes_must_split_into_one_group_per_replica(h20_values: dict[str, Any]) -> None:
    problem = _only(problems_of(h20_mp(h20_values, nodes=3, data=2)), "parallelism.data")
    assert problem.value == 2 and "3 nodes do not split into 2 equal groups" in problem.message
    assert ("nnodes (3) must be divisible by the number of data parallel node groups (2 = data_parallel_size 2 / "
            "data_parallel_size_local 1)") in (problem.upstream or "")
    assert "vllm/config/parallel.py:827-836" in (problem.upstream or "")
    assert "data: 1 with tensor: 8, pipeline: 3" in (problem.fix or "")


def test_world_size_must_split_over_the_nodes(h20_values: dict[str, Any]) -> None:
    values = h20_mp(h20_values, nodes=3)
    problem = _only(problems_of(values), "parallelism.pipeline")
    assert "TP8 x PP2 x DP1 = 16 GPUs do not split evenly over 3 nodes" in problem.message
    assert "`--nnodes 3` must evenly divide the total world size (16)" in (problem.upstream or "")
    assert "tensor: 8, pipeline: 3" in (problem.fix or "")
    values["parallelism"]["pipeline"] = 3
    plan = plan_of(values)
    assert [n.gpus_used for n in plan.nodes] == [8, 8, 8] and plan.topology["replica_nodes"] == 3


def test_a_node_too_small_for_its_share(h20_values: dict[str, Any]) -> None:
    values = h20_mp(h20_values)
    values["nodes"][1]["gpus"]["count"] = 4
    problem = _only(problems_of(values), "nodes.1.gpus.count")
    assert problem.value == 4 and "each node holds 8 GPUs of a replica" in problem.message
    assert "tensor x pipeline <= 8" in (problem.fix or "")


def test_data_parallel_local_does_not_apply(h20_values: dict[str, Any]) -> None:
    values = h20_mp(h20_values)
    values["nodes"][1]["data_parallel_local"] = 1
    problem = _only(problems_of(values), "nodes.1.data_parallel_local")
    assert "spans nodes" in problem.message and "remove data_parallel_local" in (problem.fix or "")


def test_elastic_ep_refused_with_upstream_error(h20_values: dict[str, Any]) -> None:
    values = h20_mp(h20_values)
    values["serving"]["extra_args"] = ["--enable-elastic-ep"]
    problem = _only(problems_of(values), "serving.extra_args.0")
    assert problem.upstream is not None and problem.upstream.startswith(ELASTIC_EP_MULTINODE_ERROR)


def test_dense_model_dp_over_spanning_replicas_refused(h20_values: dict[str, Any],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM 0.33.0 re-forms each dense DP rank as DP1 in its engine core but not on workers-only nodes."""
    base = get_profile("deepseek-v4-flash")
    assert base is not None
    dense = dataclasses.replace(base, moe=False)
    monkeypatch.setattr(validation, "get_profile", lambda key: dense)
    values = h20_mp(h20_values, nodes=4, data=2)
    values["parallelism"]["expert"] = False
    problem = _only(problems_of(values), "parallelism.data")
    assert problem.value == 2 and "dense model" in problem.message and "data: 1" in (problem.fix or "")
    values["parallelism"]["data"] = 1
    values["nodes"] = values["nodes"][:2]
    assert [n.role for n in plan_of(values).nodes] == ["mp-head", "mp-worker"]  # one dense replica is fine


@pytest.mark.parametrize("flag", ["--nnodes", "--node-rank", "--master-addr", "--master-port"])
def test_multinode_flags_are_managed(h20_values: dict[str, Any], flag: str) -> None:
    values = h20_mp(h20_values)
    values["serving"]["extra_args"] = [flag, "1"]
    problem = _only(problems_of(values), "serving.extra_args.0")
    assert "which the config manages" in problem.message


@pytest.mark.parametrize(("key", "clash"), [("serving.port", 8000), ("parallelism.data_parallel_rpc_port", 29550)])
def test_master_port_clash_checked(h20_values: dict[str, Any], key: str, clash: int) -> None:
    values = h20_mp(h20_values, nodes=4, data=2)
    values["parallelism"]["master_port"] = clash
    problem = _only(problems_of(values), "parallelism.master_port")
    assert problem.value == clash and f"same port as {key}" in problem.message
    assert "Address already in use" in problem.message


def test_master_port_vs_proxy_sshd_and_ephemeral(h20_values: dict[str, Any]) -> None:
    values = h20_mp(h20_values, nodes=4, data=2)
    values["parallelism"]["master_port"] = 29500  # no clash: with DP > 1 vLLM picks free ports for its DP group
    assert plan_of(values).nodes
    values["parallelism"]["master_port"] = 22
    assert "the head's sshd" in _only(problems_of(values), "parallelism.master_port").message
    values = h20_mp(h20_values)
    values["api"] = {"proxy": {"enabled": True, "port": 29501}}
    assert "same port as api.proxy.port" in _only(problems_of(values), "parallelism.master_port").message
    values = h20_mp(h20_values)
    values["parallelism"]["master_port"] = 45000
    warning, reserve = [w for w in plan_of(values).warnings if "ephemeral range" in w]   # once, under its key
    assert warning.startswith("parallelism.master_port: port(s) 45000 ") and ": 45000 -> " in reserve


def test_dspark_has_no_pp_per_replica(prod_values: dict[str, Any]) -> None:
    """prod's V4.1 + DSpark on four nodes as DP2 x (TP8 x PP2): refused exactly as on Ray."""
    prod_values["nodes"] += [clone_node(prod_values["nodes"][1], 2), clone_node(prod_values["nodes"][1], 3)]
    prod_values["parallelism"]["pipeline"] = 2
    problem = next(p for p in problems_of(prod_values) if "draft" in p.message)
    assert problem.key == "parallelism.pipeline" and problem.value == 2 and problem.upstream == DSPARK_PP_ERROR
    assert "remove `speculative`" in (problem.fix or "")
    prod_values.pop("speculative")
    plan = plan_of(prod_values)  # without the draft the same layout is accepted
    assert [n.role for n in plan.nodes] == ["mp-head", "mp-worker", "mp-replica-head", "mp-worker"]


def test_flashmla_and_engram_per_replica(prod_values: dict[str, Any]) -> None:
    prod_values["parallelism"] |= {"tensor": 16, "data": 1}
    problems = problems_of(prod_values)
    flash = next(p for p in problems if "FlashMLA" in p.message)
    assert flash.key == "parallelism.tensor" and flash.value == 16 and "ZeroDivisionError" in (flash.upstream or "")
    engram = next(p for p in problems if "Engram" in p.message)
    assert "24 heads over TP=16 x DP=1" in (engram.upstream or "")
    assert not any("each DP rank runs inside one node" in p.message for p in problems)  # TP16 spans now


def test_memory_per_gpu_per_replica(h20_values: dict[str, Any]) -> None:
    values = h20_mp(h20_values)
    values["parallelism"] |= {"tensor": 1, "pipeline": 2, "expert": False}
    for node in values["nodes"]:
        node["gpus"]["count"] = 1
    problem = _only(problems_of(values), "nodes.0.gpus.memory_gb")
    assert "weights do not fit per GPU of h20-1: experts 141.0 + dense 3.4 + replicated 0.6 = 145.0 GB" in (
        problem.message) and "PP2 stages" in problem.message
    assert "CUDA out of memory" in (problem.upstream or "")


def test_tp_across_nodes_warns(h20_values: dict[str, Any]) -> None:
    values = h20_mp(h20_values)
    values["parallelism"] |= {"tensor": 8, "pipeline": 1}
    for node in values["nodes"]:
        node["gpus"]["count"] = 4
    plan = plan_of(values)
    assert any("TP8 crosses nodes (4 GPUs of each replica per node)" in w for w in plan.warnings)
    assert not any("crosses nodes" in w for w in plan_of(h20_mp(h20_values)).warnings)


def test_no_more_nodes_than_replicas_keeps_one_node_per_rank(prod_values: dict[str, Any]) -> None:
    prod_values["parallelism"]["pipeline"] = 2
    prod_values.pop("speculative")
    problem = _only(problems_of(prod_values), "parallelism.tensor")  # 2 nodes, DP2: a replica cannot span
    assert "each DP rank runs inside one node: TP8 x PP2 > 8 GPUs" in problem.message
    assert "more nodes than replicas" in (problem.fix or "")


def test_h20_itself_stays_on_ray(h20_values: dict[str, Any]) -> None:
    plan = plan_of(h20_values)
    assert [n.role for n in plan.nodes] == ["ray-head", "ray-worker"] and plan.topology["replica_nodes"] == 1
    assert not any("--nnodes" in (n.containers[0].vllm_args or []) for n in plan.nodes)


def test_plan_cli_on_the_committed_h20_stack() -> None:
    out = subprocess.run([sys.executable, "-m", "stacks", "plan", "h20", "--set", "parallelism.backend=mp", "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert [n["role"] for n in plan["nodes"]] == ["mp-head", "mp-worker"] and plan["start_order"] == ["h20-2", "h20-1"]
    bad = subprocess.run([sys.executable, "-m", "stacks", "plan", "h20", "--set", "parallelism.backend=mp",
                          "--set", "parallelism.master_port=8000"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "parallelism.master_port = 8000" in bad.stdout + bad.stderr
    assert "Traceback" not in bad.stdout + bad.stderr


# --- every argv through the captured 0.33.0 flag table --------------------------------------------------------


def _parse(argv: list[str], expect: dict[str, str]) -> dict[str, Any]:
    env = {**os.environ, **standin_env()}
    args = [f"--expect={k}={v}" for k, v in expect.items()]
    out = subprocess.run([sys.executable, "-m", "checks.vllm_args", "--json", *args, "--", *argv], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    verdict: dict[str, Any] = json.loads(out.stdout)
    verdict["rc"] = out.returncode
    return verdict


@pytest.mark.parametrize(("nodes", "data", "pipeline"), [(2, 1, 2), (4, 2, 2), (4, 1, 4), (6, 3, 2)])
def test_every_argv_parses_with_the_real_flag_table(h20_values: dict[str, Any], nodes: int, data: int,
                                                    pipeline: int) -> None:
    values = h20_mp(h20_values, nodes=nodes, data=data)
    values["parallelism"]["pipeline"] = pipeline
    plan = plan_of(values)
    for i, node in enumerate(plan.nodes):
        expect = {"nnodes": str(nodes), "node_rank": str(i), "master_addr": "192.0.2.11", "master_port": "29501",
                  "headless": str(i > 0), "pipeline_parallel_size": str(pipeline),
                  "data_parallel_start_rank": "None", "distributed_executor_backend": "mp"}
        if data > 1:
            expect |= {"data_parallel_size": str(data), "data_parallel_size_local": "1",
                       "data_parallel_address": "192.0.2.11",
                       "data_parallel_rpc_port": "29550", "data_parallel_backend": "mp"}
        verdict = _parse(node.containers[0].vllm_args or [], expect)
        assert verdict["rc"] == 0 and verdict["status"] == "pass", (node.name, verdict)


def test_the_flag_table_rejects_a_misspelt_multinode_flag() -> None:
    verdict = _parse(["/m", "--nnodes", "2", "--node-ranks", "1"], {})
    assert verdict["rc"] == 1 and "unrecognized arguments: --node-ranks 1" in " ".join(verdict["evidence"])


# --- the dry run in a real Docker engine ----------------------------------------------------------------------

GOOD = f"vllm-cluster-mpexec-test/vllm:0.33.0-{RUN}"
NO_NNODES = f"vllm-cluster-mpexec-test/vllm:no-nnodes-{RUN}"


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    why = docker_ready()
    assert why is None, f"these tests need a Docker engine (`make services` starts dockerd): {why}"
    work = tmp_path_factory.mktemp("mpexec-images")
    tags = {"good": build_image(GOOD, work),
            # a vLLM whose parser has no --nnodes: the dry run must stop the rollout before any engine moves
            "old": build_image(NO_NNODES, work, renamed_flag("--nnodes", "--num-nodes", "0.0.0-no-nnodes"))}
    yield tags
    for tag in tags.values():
        remove_image(tag)


@pytest.mark.parametrize(("nodes", "data"), [(2, 1), (4, 2)])
def test_dry_run_passes_on_every_node_in_docker(h20_values: dict[str, Any], images: dict[str, str], nodes: int,
                                                data: int) -> None:
    values = h20_mp(h20_values, nodes=nodes, data=data)
    values["image"] = images["good"]
    config = parse_config("t", values)
    plan = build_plan("t", config)
    checks = [c for c in plan.checks if c.module == "checks.vllm_args"]
    assert len(checks) == nodes
    for check in checks:
        command = dry_run_command(config, plan, check)
        rank = plan.node(str(check.node)).node_rank
        assert f"--expect nnodes={nodes} --expect node_rank={rank} --expect master_addr=192.0.2.11" in command
        out = run_shell(command)
        line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-400:]
        assert out.returncode == 0 and line.startswith(f"PASS args-dry-run-{check.node}: vLLM 0.33.0 "), line


def test_dry_run_fails_on_an_image_without_nnodes(h20_values: dict[str, Any], images: dict[str, str]) -> None:
    values = h20_mp(h20_values)
    values["image"] = images["old"]
    config = parse_config("t", values)
    plan = build_plan("t", config)
    for check in (c for c in plan.checks if c.module == "checks.vllm_args"):
        out = run_shell(dry_run_command(config, plan, check))
        line = out.stdout.strip().splitlines()[-1]
        assert out.returncode == 1 and "unrecognized arguments: --nnodes" in line, line


# --- engine evidence from vLLM-format logs --------------------------------------------------------------------

# Lines in vLLM 0.33.0's format: `(<process> pid=N) LEVEL date [file:line] message` (vllm/logger.py:28-32),
# worker names from vllm/v1/executor/multiproc_executor.py:1214-1228, messages from gpu_model_runner.py:5088
# and v1/core/kv_cache_utils.py:1148.
WORKER_LOG = "".join(
    f"(Worker_PP1_TP{t}_EP{t} pid={500 + t}) INFO 12-02 10:{20 + t}:00 [gpu_model_runner.py:5088] Model loading took "
    f"18.1 GiB memory and 1201.5 seconds\n" for t in range(8))
HEAD_LOG = ("(APIServer pid=1) INFO 12-02 10:00:00 [api_server.py:1] vLLM API server version 0.33.0\n"
            + WORKER_LOG.replace("_PP1_", "_PP0_").replace("pid=5", "pid=4")
            + "(EngineCore pid=322) INFO 12-02 10:31:02 [kv_cache_utils.py:1148] GPU KV cache size: 412,160 tokens\n")


def test_worker_node_evidence() -> None:
    ok = engines(WORKER_LOG, [], "engines-h20-2", workers=8)
    assert ok.status == "pass" and "all 8 worker(s) on this node loaded" in ok.summary
    missing = engines("\n".join(WORKER_LOG.splitlines()[:6]), [], workers=8)
    assert missing.status == "fail" and "only 6 of this node's 8" in missing.summary
    assert "--master-port" in (missing.next_step or "")
    died = engines(WORKER_LOG + "(Worker pid=1) ERROR 12-02 10:40:00 [multiproc_executor.py:380] Worker proc "
                   "VllmWorker-11 died unexpectedly (exit code: -9), shutting down executor.\n", [], workers=8)
    assert died.status == "fail" and "VllmWorker-11" in died.summary


def test_head_evidence_with_dp1_engine_core_name() -> None:
    ok = engines(HEAD_LOG, [0], "engines-h20-1", workers=8)
    assert ok.status == "pass" and "its 8 worker(s) loaded" in ok.summary
    no_kv = engines(HEAD_LOG.rsplit("(EngineCore", 1)[0], [0], workers=8)
    assert no_kv.status == "fail" and "[0] never reported" in no_kv.summary


def test_shipped_engines_check_reads_a_log_file(tmp_path: Any) -> None:
    log = tmp_path / "h20-2.log"
    log.write_text(WORKER_LOG)
    command = heredoc_command("engines", ["--name", "engines-h20-2", "--log-file", str(log), "--ranks", "",
                                         "--workers", "8"])
    shipped = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, cwd="/", timeout=60)
    assert shipped.returncode == 0 and shipped.stdout.startswith("PASS engines-h20-2"), shipped.stdout
    command = command.replace("--workers 8", "--workers 9")
    shipped = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, cwd="/", timeout=60)
    assert shipped.returncode == 1 and "only 8 of this node's 9" in shipped.stdout


# --- the Pulumi program under mocks: start order as depends_on edges -----------------------------------------


@pytest.fixture(scope="module")
def four(request: pytest.FixtureRequest) -> Run:
    return run_program("h20", h20_mp(read_stack_values("h20"), nodes=4, data=2))


def test_program_start_order_edges(four: Run) -> None:
    assert four.error is None, four.error
    engine = four.result["engine"]
    containers = engine.containers
    assert list(containers) == ["h20-2", "h20-3", "h20-4", "h20-1"]  # registered in start order
    head_deps = four.options["engine-h20-1-vllm-ray"].depends_on or []
    for name in ("h20-2", "h20-3", "h20-4"):
        assert containers[name] in head_deps  # the head starts after every headless node was created
        deps = four.options[f"engine-{name}-vllm-ray"].depends_on or []
        assert not any(c in deps for c in containers.values())  # headless nodes wait on no container
        # …but on every node's collective check, each after every node's dry run
        assert all(waits_for(four, containers[name], c) for c in four.result["collectives"].values())
    assert all(waits_for(four, containers["h20-1"], c) for c in four.result["collectives"].values())
    for c in four.result["collectives"].values():
        assert all(waits_for(four, c, d) for d in engine.dry_runs.values())
    assert engine.ray_ready is None and not [r for r in four.mocks.resources if "ray" in r.name and "ready" in r.name]


def test_program_registers_the_plan_per_node(four: Run) -> None:
    containers = {r.name: r for r in four.mocks.of_type("docker:index/container:Container")}
    worker = containers["engine-h20-4-vllm-ray"].inputs
    assert worker["command"][:2] == [V4, "--headless"] and "--node-rank" in worker["command"]
    assert worker["command"][worker["command"].index("--node-rank") + 1] == "3"
    assert not worker.get("entrypoints") and not worker.get("healthcheck")
    head = containers["engine-h20-1-vllm-ray"].inputs
    assert head["healthcheck"]["tests"][0] == "CMD"
    evidence = {r.name: r.inputs["create"] for r in four.mocks.of_type("command:remote:Command")
                if r.name.endswith("-dp-engines")}
    assert sorted(evidence) == [f"engine-h20-{i}-dp-engines" for i in range(1, 5)]
    assert "--name engines-h20-4 --container vllm-ray --ranks '' --workers 8" in evidence["engine-h20-4-dp-engines"]
    assert four.outputs["nodes"] == {"h20-1": "mp-head", "h20-2": "mp-worker", "h20-3": "mp-replica-head",
                                     "h20-4": "mp-worker"}

"""Property tests: every accepted topology has consistent ranks, one head, and GPUs used <= present."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stacks.model.errors import ConfigError
from stacks.model.loader import parse_config, read_stack_values
from stacks.planner.plan import build_plan
from tests.conftest import clone_node, flag_pairs

PROD = read_stack_values("prod")


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    values = copy.deepcopy(PROD)
    n = draw(st.integers(1, 12))
    gpus = draw(st.sampled_from([1, 2, 4, 8]))
    nodes = [clone_node(values["nodes"][1], i) for i in range(n)]
    for node in nodes:
        node["gpus"]["count"] = draw(st.sampled_from([gpus, 8])) if draw(st.booleans()) else gpus
    values["nodes"] = nodes
    values["model"]["weights_gb"] = draw(st.sampled_from([10, 100, 511]))
    values["parallelism"] = {
        "tensor": draw(st.sampled_from([1, 2, 4, 8, 16])),
        "pipeline": draw(st.sampled_from([1, 2, 3])),
        "data": draw(st.integers(1, 16)),
        "expert": draw(st.booleans()),
        "backend": draw(st.sampled_from(["mp", "ray"])),
        "data_parallel_rpc_port": 13399,
    }
    if draw(st.booleans()):
        values["speculative"] = None
    values["vision"] = draw(st.booleans())
    return values


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_accepted_topologies_are_consistent(values: dict[str, Any]) -> None:
    try:
        plan = build_plan("prop", parse_config("prop", values))
    except ConfigError as exc:
        assert exc.problems and all(p.key and p.message for p in exc.problems)
        return
    par = values["parallelism"]
    heads = [n for n in plan.nodes if n.role in ("dp-head", "ray-head", "mp-head")]
    assert len(heads) == 1 and plan.nodes[0] is heads[0]
    assert all(0 < n.gpus_used <= n.gpus_present for n in plan.nodes)
    assert sorted(plan.start_order) == sorted(n.name for n in plan.nodes)
    if par["backend"] == "mp" and plan.topology["replica_nodes"] > 1:
        # A replica spans nodes (vLLM's --nnodes): equal shares, one engine core per replica, ranks from the order.
        n, k = len(plan.nodes), plan.topology["replica_nodes"]
        assert n == k * par["data"] and par["tensor"] * par["pipeline"] > min(x.gpus_present for x in plan.nodes)
        assert [r for x in plan.nodes for r in x.dp_ranks] == list(range(par["data"]))
        assert plan.start_order[-1] == plan.head.name
        for i, node in enumerate(plan.nodes):
            flags = dict(flag_pairs((node.containers[0].vllm_args or [])[1:]))
            assert node.gpus_used == par["tensor"] * par["pipeline"] // k and node.replica == i // k
            assert flags["--nnodes"] == str(n) and flags["--node-rank"] == str(i)
            assert flags["--master-addr"] == plan.head.containers[0].env["VLLM_HOST_IP"]
            assert ("--headless" in flags) == (i > 0) and "--data-parallel-start-rank" not in flags
            assert node.role == ("mp-head" if i == 0 else "mp-replica-head" if i % k == 0 else "mp-worker")
    elif par["backend"] == "mp":
        ranks = [r for n in plan.nodes for r in n.dp_ranks]
        assert ranks == list(range(par["data"]))
        assert plan.head.dp_start_rank is None and plan.start_order[-1] == plan.head.name
        for node in plan.nodes:
            flags = dict(flag_pairs((node.containers[0].vllm_args or [])[1:]))
            assert ("--data-parallel-start-rank" in flags) == (node.role == "headless-engine" and par["data"] > 1)
            assert node.gpus_used == len(node.dp_ranks) * par["tensor"] * par["pipeline"]
    else:
        assert par["tensor"] * par["pipeline"] == sum(n.gpus_used for n in plan.nodes)
        assert plan.start_order[0] == plan.head.name
    if par["expert"]:
        assert plan.topology["expert"] == par["tensor"] * par["data"]

"""Nothing assumes two nodes: a 4-node DP4 x TP8 and a 3-node Ray TP8 x PP3."""

from __future__ import annotations

from typing import Any

from tests.conftest import clone_node, flag_pairs, plan_of


def test_four_node_dp4_tp8(prod_values: dict[str, Any]) -> None:
    base = prod_values["nodes"][1]
    prod_values["nodes"] += [clone_node(base, 2), clone_node(base, 3)]
    prod_values["parallelism"]["data"] = 4
    plan = plan_of(prod_values)
    assert plan.topology["expert"] == 32
    assert [n.dp_start_rank for n in plan.nodes] == [None, 1, 2, 3]
    assert plan.start_order == ["node2", "node3", "node4", "node1"]
    for node, rank in zip(plan.nodes[1:], ("1", "2", "3"), strict=True):
        flags = dict(flag_pairs((node.containers[0].vllm_args or [])[1:]))
        assert flags["--data-parallel-start-rank"] == rank
        assert flags["--data-parallel-size"] == "4" and "--headless" in flags
        assert flags["--data-parallel-address"] == "1.1.1.2"
    head_flags = dict(flag_pairs((plan.head.containers[0].vllm_args or [])[1:]))
    assert "--data-parallel-start-rank" not in head_flags and "--headless" not in head_flags
    assert any("up to 512 active sequences" in n for n in plan.notes)


def test_two_local_ranks_per_node(prod_values: dict[str, Any]) -> None:
    prod_values["parallelism"] |= {"tensor": 4, "data": 4}
    plan = plan_of(prod_values)
    assert [n.dp_ranks for n in plan.nodes] == [[0, 1], [2, 3]]
    flags = dict(flag_pairs((plan.nodes[1].containers[0].vllm_args or [])[1:]))
    assert flags["--data-parallel-size-local"] == "2" and flags["--data-parallel-start-rank"] == "2"


def test_three_node_ray_tp8_pp3(h20_values: dict[str, Any]) -> None:
    third = clone_node(h20_values["nodes"][1], 2)
    third["name"] = "h20-3"
    third["ssh"]["host"] = third["management_ip"] = "192.0.2.13"
    h20_values["nodes"].append(third)
    h20_values["parallelism"]["pipeline"] = 3
    plan = plan_of(h20_values)
    assert [n.role for n in plan.nodes] == ["ray-head", "ray-worker", "ray-worker"]
    assert plan.start_order == ["h20-1", "h20-2", "h20-3"]
    head = plan.head.containers[0]
    assert "want_n,want_g,deadline=3,24," in head.command[0]
    assert dict(flag_pairs((head.vllm_args or [])[1:]))["--pipeline-parallel-size"] == "3"
    assert plan.nodes[2].containers[0].command[1] == "--address=192.0.2.11:6379"


def test_single_node(prod_values: dict[str, Any]) -> None:
    prod_values["nodes"] = prod_values["nodes"][:1]
    prod_values["parallelism"]["data"] = 1
    prod_values["model"]["weights_gb"] = 300
    prod_values["speculative"] = None
    plan = plan_of(prod_values)
    args = plan.head.containers[0].vllm_args or []
    assert "--data-parallel-size" not in args and plan.start_order == ["node1"]


def test_nccl_evidence_only_where_it_can_exist(prod_values: dict[str, Any], h20_values: dict[str, Any]) -> None:
    names = [c.name for c in plan_of(prod_values).checks if c.module == "checks.nccl_transport"]
    assert names == ["nccl-transport-node1", "nccl-transport-node2"]
    names = [c.name for c in plan_of(h20_values).checks if c.module == "checks.nccl_transport"]
    assert names == ["nccl-transport-h20-1"]  # Ray forwards the workers' output to the head's log
    prod_values["fabric"]["nccl_debug"] = "WARN"
    plan = plan_of(prod_values)
    assert not [c for c in plan.checks if c.module == "checks.nccl_transport"]
    assert any("will not be verified" in w for w in plan.warnings)

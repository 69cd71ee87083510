"""Settings that do nothing or hide what a check reads are warned with the reason; the GPU table's rows are
consistent with what nvidia-smi prints. (Refusals of this kind are rows of tests/test_bad_configs.py.)"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from stacks.planner.gpus import KNOWN_GPUS, expected_memory_gb, memory_fits
from tests.conftest import plan_of


def _warnings(values: dict[str, Any]) -> str:
    return "\n".join(plan_of(values).warnings)


def test_an_unknown_gpu_model_is_warned_not_refused(prod_values: dict[str, Any]) -> None:
    values = copy.deepcopy(prod_values)
    for node in values["nodes"]:
        node["gpus"]["model"] = "Acme Tensor 9000"
    assert "GPU model 'Acme Tensor 9000' is not in the table of known GPUs" in _warnings(values)
    assert "not in the table of known GPUs" not in _warnings(prod_values)


@pytest.mark.parametrize(("name", "mib"), [
    ("NVIDIA H100 80GB HBM3", 81559), ("NVIDIA H200", 143771), ("NVIDIA H20", 97871),
    ("NVIDIA A100-SXM4-40GB", 40960), ("NVIDIA A100-SXM4-80GB", 81920), ("NVIDIA B200", 183359),
    ("NVIDIA H100 NVL", 95830), ("NVIDIA L40S", 46068), ("NVIDIA GH200 480GB", 97871),
])
def test_what_nvidia_smi_prints_fits_the_table(name: str, mib: int) -> None:
    """Typical nvidia-smi memory.total values (MiB) for these GPUs, read as decimal GB and as GiB,
    both fit the row the name selects, so a stack may copy either figure."""
    known = expected_memory_gb(name)
    assert known is not None, name
    assert memory_fits(mib * 1.048576 / 1000, known[1]) and memory_fits(mib / 1024, known[1]), (name, known)


def test_specific_rows_come_before_their_prefixes() -> None:
    assert expected_memory_gb("NVIDIA GH200 480GB") is not None
    assert expected_memory_gb("NVIDIA GH200 480GB")[0].family == "GH200"  # type: ignore[index]
    assert expected_memory_gb("NVIDIA H20")[0].family == "H20"  # type: ignore[index]
    assert expected_memory_gb("NVIDIA L40S")[0].family == "L40S"  # type: ignore[index]
    assert all(gpu.source for gpu in KNOWN_GPUS)


def test_ray_settings_under_mp_are_warned(prod_values: dict[str, Any]) -> None:
    values = copy.deepcopy(prod_values)
    assert values["parallelism"]["backend"] == "mp"
    values["ray"] = {"gcs_port": 6380}
    assert "ray.gcs_port set, but parallelism.backend is mp" in _warnings(values)
    assert "does nothing" not in _warnings(prod_values)


def test_a_master_port_without_a_spanning_replica_is_warned(prod_values: dict[str, Any]) -> None:
    values = copy.deepcopy(prod_values)
    values["parallelism"]["master_port"] = 29600
    assert "parallelism.master_port 29600 set, but no replica spans nodes" in _warnings(values)


def test_a_quiet_nccl_log_is_warned_because_the_transport_check_stops(prod_values: dict[str, Any]) -> None:
    values = copy.deepcopy(prod_values)
    values["fabric"]["nccl_debug"] = "WARN"
    plan = plan_of(values)
    assert sum("fabric.nccl_debug is not INFO" in w for w in plan.warnings) == 1  # said once
    assert not [c for c in plan.checks if c.module == "checks.nccl_transport"]


@pytest.mark.parametrize("subsys", ["INIT,NET", "ALL", "INIT,NET,ENV", "^COLL"])
def test_a_debug_subsystem_list_that_keeps_init_and_net_is_accepted(prod_values: dict[str, Any],
                                                                     subsys: str) -> None:
    values = copy.deepcopy(prod_values)
    values["fabric"]["env"] = {"NCCL_DEBUG_SUBSYS": subsys}
    plan_of(values)


def test_fabric_preflight_asks_only_for_sections_with_something_to_check(prod_values: dict[str, Any]) -> None:
    """prod sets no gid_index: no gid section (it once passed with 'no gid_index configured')."""
    plan = plan_of(prod_values)
    fabric = next(c for c in plan.checks if c.name == "fabric-node1")
    assert fabric.sections == ["infiniband", "hca", "sysctl"]
    values = copy.deepcopy(prod_values)
    for node in values["nodes"]:
        node["gid_index"] = 3
    fabric = next(c for c in plan_of(values).checks if c.name == "fabric-node1")
    assert fabric.sections == ["infiniband", "hca", "gid", "sysctl"]


def _numa(values: dict[str, Any], *words: str) -> dict[str, Any]:
    changed = copy.deepcopy(values)
    changed["serving"]["extra_args"] = list(words)
    return changed


def test_numa_binding_lists_need_numa_bind_and_one_entry_per_gpu(prod_values: dict[str, Any]) -> None:
    """vLLM 0.33.0 refuses the lists without --numa-bind when it builds its config, and fails a worker whose GPU
    index is past a list's end at start-up: both are decided from the stack alone (prod: 8 GPUs per node)."""
    from stacks.model.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        plan_of(_numa(prod_values, "--numa-bind-nodes", *"00001111"))
    assert "without --numa-bind" in str(refused.value) and "parallel.py:556-561" in str(refused.value)
    with pytest.raises(ConfigError) as short:
        plan_of(_numa(prod_values, "--numa-bind", "--numa-bind-cpus", "0-3", "4-7"))
    assert "lists 2 entries and the engine container on node node1 (nodes.0) sees 8 GPUs" in str(short.value)
    assert "one entry per GPU the container sees: 8 entries" in str(short.value)
    plan = plan_of(_numa(prod_values, "--numa-bind", "--numa-bind-nodes", *"00001111"))
    assert "--numa-bind-nodes" in (plan.nodes[0].containers[0].vllm_args or [])
    assert not any("numa" in w for w in plan.warnings)
    longer = plan_of(_numa(prod_values, "--numa-bind", "--numa-bind-nodes", *"0000111122"))
    assert any("10 entries and node node1 has 8 GPUs; vLLM uses the first 8" in w for w in longer.warnings)


@pytest.mark.parametrize(("words", "said", "upstream"), [
    (["--numa-bind-nodes", *"0000111", "-1"], "lists a negative NUMA node",
     "numa_bind_nodes must contain non-negative integers. (vllm/config/parallel.py:484-493)"),
    (["--numa-bind-cpus", *["0-3"] * 7, "4:7"], "'4:7' is not a numactl CPU list",
     "for example '0-3' or '0,2,4-7'. (vllm/config/parallel.py:503-510)"),
    (["--numa-bind-cpus", *["0-3"] * 7, "0,7-4"], "'0,7-4' has a descending range",
     "ranges must be ascending, but got '0,7-4'. (vllm/config/parallel.py:511-518)"),
], ids=["negative node", "not numactl syntax", "descending range"])
def test_numa_binding_values_vllm_refuses_are_refused(prod_values: dict[str, Any], words: list[str], said: str,
                                                     upstream: str) -> None:
    """ParallelConfig's field validators, run when vLLM builds its config: the lists' values, beside their length."""
    from stacks.model.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        plan_of(_numa(prod_values, "--numa-bind", *words))
    found = [p for p in refused.value.problems if said in p.message]
    assert len(found) == 1 and len(refused.value.problems) == 1, [p.render() for p in refused.value.problems]
    assert upstream in (found[0].upstream or "") and "(engine start-up" in (found[0].upstream or "")
    assert found[0].key == "serving.extra_args" and found[0].fix
    plan_of(_numa(prod_values, "--numa-bind", "--numa-bind-cpus", *["0-3,8"] * 8))  # numactl's syntax plans


def _external_numa(tensor: int, *words: str) -> dict[str, Any]:
    from tests.test_external_load_balancing import external

    values = external(nodes=1, tensor=tensor)
    values["serving"]["extra_args"] = ["--numa-bind", *words]
    return values


def test_numa_lists_with_external_load_balancing_are_read_per_rank_container() -> None:
    """External load balancing runs one container per DP rank, each seeing its own TP x PP GPUs as 0..k-1 and
    all reading the same extra_args (vLLM 0.33.0: GPU index = local rank there, vllm/config/parallel.py:842-856).
    A list of one rank's length is enough; a node-wide list whose later ranks' entries differ would bind them
    to rank 0's NUMA nodes: refused; one whose entries repeat per rank plans."""
    from stacks.model.errors import ConfigError

    per_rank = plan_of(_external_numa(4, "--numa-bind-nodes", *"0000"))  # TP4: 2 ranks x 4 GPUs on one node
    assert any("each of the 2 DP ranks' containers on node" in w and "bound alike" in w for w in per_rank.warnings)
    with pytest.raises(ConfigError) as refused:
        plan_of(_external_numa(4, "--numa-bind-nodes", *"00001111"))
    problem = next(p for p in refused.value.problems if "dp_load_balancing: external" in p.message)
    assert len(refused.value.problems) == 1 and problem.key == "serving.extra_args"
    assert problem.value == "--numa-bind-nodes 0 0 0 0 1 1 1 1"
    assert "DP rank 1 on node" in problem.message and "(GPUs 4-7) would be bound to 0 0 0 0" in problem.message
    assert "vllm/utils/numa_utils.py:226-244" in problem.message and "drop --numa-bind-nodes" in (problem.fix or "")
    with pytest.raises(ConfigError) as short:
        plan_of(_external_numa(4, "--numa-bind-cpus", "0-3", "4-7"))
    assert "each DP rank's container on node" in str(short.value) and "sees 4 GPUs" in str(short.value)
    same = plan_of(_external_numa(4, "--numa-bind-nodes", *"00000000"))
    assert not any("numa" in w for w in same.warnings)

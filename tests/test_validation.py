"""Each rule: a failing config, the key it names, and the upstream failure it quotes."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from stacks.model.errors import Problem
from stacks.planner.managed_options import HYBRID_LB_ERROR
from tests.conftest import clone_node, plan_of, problems_of


def _only(problems: list[Problem], key: str) -> Problem:
    matching = [p for p in problems if p.key == key]
    assert matching, f"no problem for {key}: {[p.render() for p in problems]}"
    return matching[0]


def test_prod_and_h20_are_valid(prod_values: dict[str, Any], h20_values: dict[str, Any]) -> None:
    plan_of(prod_values)
    plan_of(h20_values)


def test_v41_tp16_rejected_with_flashmla_and_engram_errors(prod_values: dict[str, Any]) -> None:
    prod_values["parallelism"] |= {"tensor": 16, "data": 1}
    prod_values["serving"]["extra_args"] = []
    problems = problems_of(prod_values)
    texts = "\n".join(p.render() for p in problems)
    assert "ZeroDivisionError" in texts and "n_local_groups" in texts
    assert "Engram sharding leaves ranks without hash heads: 24 heads over TP=16 x DP=1" in texts
    flash = next(p for p in problems if "FlashMLA" in p.message)
    assert flash.key == "parallelism.tensor" and flash.value == 16 and "DP2 x TP8" in (flash.fix or "")


def test_engram_rule_is_the_ceil_formula(prod_values: dict[str, Any]) -> None:
    # 24 heads: TP8 -> 7*3=21 < 24 passes (prod); TP16 -> 15*2=30 fails (above).
    from stacks.model.loader import parse_config
    from stacks.planner.validation import validate
    _, _, result = validate(parse_config("t", prod_values))
    assert not any("Engram" in p.message for p in result.problems)


def test_dspark_with_pp_rejected(prod_values: dict[str, Any]) -> None:
    prod_values["parallelism"] |= {"pipeline": 2, "data": 1, "backend": "ray"}
    problem = next(p for p in problems_of(prod_values) if "draft" in p.message)
    assert problem.key == "parallelism.pipeline" and problem.value == 2
    assert "Pipeline parallelism is not supported for this model" in (problem.upstream or "")
    assert "remove `speculative`" in (problem.fix or "")


def test_vision_with_pp_on_0909_image_rejected(prod_values: dict[str, Any]) -> None:
    prod_values["image"]["tag"] = "deepseekv41-flash-0909"
    prod_values["parallelism"] |= {"pipeline": 2, "data": 1, "backend": "ray"}
    prod_values.pop("speculative")
    problem = _only(problems_of(prod_values), "vision")
    assert "DeepSeek V4 vision MoE routing requires input_ids" in (problem.upstream or "")
    assert "--language-model-only" in (problem.fix or "")


def test_vision_off_adds_language_model_only(prod_values: dict[str, Any]) -> None:
    prod_values["vision"] = False
    args = plan_of(prod_values).head.containers[0].vllm_args or []
    assert "--language-model-only" in args


def test_start_rank_on_head_rejected(prod_values: dict[str, Any]) -> None:
    prod_values["serving"]["extra_args"] = ["--data-parallel-start-rank", "0"]
    problem = _only(problems_of(prod_values), "serving.extra_args.0")
    assert problem.upstream == HYBRID_LB_ERROR and "vllm/v1/engine/utils.py:1502-1508" in problem.upstream


def test_heads_not_divisible_by_tp(prod_values: dict[str, Any]) -> None:
    prod_values["parallelism"] |= {"tensor": 3, "data": 2}
    prod_values["nodes"][0]["gpus"]["count"] = 3
    prod_values["nodes"][1]["gpus"]["count"] = 3
    problem = next(p for p in problems_of(prod_values) if "attention heads" in p.message)
    assert "must be divisible by tensor parallel size (3)" in (problem.upstream or "")


def test_mp_gpus_per_node_vs_tp(prod_values: dict[str, Any]) -> None:
    prod_values["nodes"][1]["gpus"]["count"] = 4
    problems = problems_of(prod_values)
    assert any(p.key == "parallelism.data" and "do not map onto the nodes" in p.message for p in problems)


def test_dp_ranks_must_map_onto_nodes(prod_values: dict[str, Any]) -> None:
    prod_values["parallelism"]["data"] = 3
    problem = _only(problems_of(prod_values), "parallelism.data")
    assert "2 rank(s) fit" in problem.message and "parallelism.data = 2" in (problem.fix or "")


def test_idle_node_rejected(prod_values: dict[str, Any]) -> None:
    prod_values["nodes"].append(clone_node(prod_values["nodes"][1], 2))
    problem = _only(problems_of(prod_values), "nodes.2.name")
    assert "no DP rank" in problem.message and "parallelism.data to 3" in (problem.fix or "")


def test_ray_tp_times_pp_must_equal_gpus(h20_values: dict[str, Any]) -> None:
    h20_values["parallelism"]["pipeline"] = 1
    problem = _only(problems_of(h20_values), "parallelism.pipeline")
    assert "TP8 x PP1 = 8 GPUs, the nodes have 16" in problem.message


def test_ray_rejects_data_parallel(h20_values: dict[str, Any]) -> None:
    h20_values["parallelism"]["data"] = 2
    assert "ray backend" in _only(problems_of(h20_values), "parallelism.data").message


def test_unique_node_names(prod_values: dict[str, Any]) -> None:
    prod_values["nodes"][1]["name"] = prod_values["nodes"][0]["name"]
    assert _only(problems_of(prod_values), "nodes.1.name").message == "used by more than one node"


@pytest.mark.parametrize("key", ["ssh.host", "management_ip"])
def test_one_address_belongs_to_one_node(prod_values: dict[str, Any], key: str) -> None:
    """An SSH host or management IP that is another node's address: both deploys would land on one machine."""
    first, second = prod_values["nodes"]
    if key == "ssh.host":
        second["ssh"]["host"] = first["ssh"]["host"]
    else:
        second[key] = first[key]
    assert _only(problems_of(prod_values), f"nodes.1.{key}").message == \
        "is node node1's management_ip too: one address, one node"


def test_unique_data_ips(prod_values: dict[str, Any]) -> None:
    prod_values["nodes"][1]["data_ips"] = ["1.1.1.2", "1.1.2.1"]
    problem = _only(problems_of(prod_values), "nodes.1.data_ips.0")
    assert problem.value == "1.1.1.2" and "is node node1's data_ips.0 too" in problem.message


def test_distinct_ports(prod_values: dict[str, Any]) -> None:
    prod_values["parallelism"]["data_parallel_rpc_port"] = 8030
    problem = _only(problems_of(prod_values), "parallelism.data_parallel_rpc_port")
    assert "Address already in use" in problem.message


def test_weights_fit_message(prod_values: dict[str, Any]) -> None:
    for node in prod_values["nodes"]:
        node["gpus"]["memory_gb"] = 40
    prod_values["parallelism"]["expert"] = False
    problem = next(p for p in problems_of(prod_values) if "weights do not fit" in p.message)
    # Without EP vLLM still spreads the experts over DP x TP (slices, not whole experts): tests/test_memory_model.py
    expect = "experts 17.2 + dense 3.5 + replicated 5.0 + Engram 25.3 = 51.0 GB > 40 GB x 0.95 = 38.0 GB"
    assert expect in problem.message
    assert problem.key == "nodes.0.gpus.memory_gb"


def test_min_vram(prod_values: dict[str, Any]) -> None:
    prod_values["parallelism"]["data"] = 1
    prod_values["nodes"] = prod_values["nodes"][:1]
    problem = _only(problems_of(prod_values), "nodes")
    assert "needs ~614 GB" in problem.message


def test_managed_flag_in_extra_args(prod_values: dict[str, Any]) -> None:
    prod_values["serving"]["extra_args"] = ["--tensor-parallel-size=16"]
    assert "set parallelism.tensor instead" in (_only(problems_of(prod_values), "serving.extra_args.0").fix or "")


def test_api_key_in_argv_rejected(prod_values: dict[str, Any]) -> None:
    prod_values["serving"]["extra_args"] = ["--api-key", "sk-123"]
    problem = _only(problems_of(prod_values), "serving.extra_args.0")
    assert "sk-123" not in problem.render() and "--secret" in (problem.fix or "")


def test_plain_api_key_rejected(prod_values: dict[str, Any]) -> None:
    prod_values["api_key"] = "sk-plain"
    problem = _only(problems_of(prod_values), "api_key")
    assert "sk-plain" not in problem.render()


def test_image_without_profile(h20_values: dict[str, Any]) -> None:
    h20_values["image"]["tag"] = "deepseekv41-flash-0909"  # seed 000's V4.1-only build
    problems = problems_of(h20_values)
    assert "Model architectures ['DeepseekV4ForCausalLM'] are not supported" in (
        _only(problems, "image.tag").upstream or "")
    assert "No tokenizer registered for tokenizer_mode='deepseek_v4'" in (
        _only(problems, "serving.tokenizer_mode").upstream or "")
    assert "invalid tool call parser: deepseek_v4" in (_only(problems, "serving.tool_call_parser").upstream or "")


def test_vllm_0_33_0_runs_both_profiles(prod_values: dict[str, Any]) -> None:
    """Read from the 0.33.0 wheel: V4.1 architecture, deepseek_v41 parsers and dspark are all in it."""
    prod_values["image"]["tag"] = "v0.33.0"
    plan = plan_of(prod_values)
    assert plan.image["known"] and plan.image["vllm_version"] == "0.33.0"


def test_unknown_image_warns_and_uses_general_rules(prod_values: dict[str, Any]) -> None:
    prod_values["image"]["tag"] = "my-private-build"
    plan = plan_of(prod_values)
    assert any("is not a known image" in w and "python -m stacks image-card" in w for w in plan.warnings)
    prod_values["parallelism"] |= {"tensor": 16, "data": 1}
    assert any("FlashMLA" in p.message for p in problems_of(prod_values))


def test_max_model_len_above_context(h20_values: dict[str, Any]) -> None:
    h20_values["serving"]["max_model_len"] = 2_000_000
    assert _only(problems_of(h20_values), "serving.max_model_len").value == 2_000_000


def test_fabric_needs_hcas_and_ifnames(h20_values: dict[str, Any]) -> None:
    h20_values["nodes"][1]["hcas"] = []
    del h20_values["nodes"][1]["management_ifname"]
    problems = problems_of(h20_values)
    assert "NET/Socket" in _only(problems, "nodes.1.hcas").message
    assert _only(problems, "nodes.1.management_ifname")


def test_chunk_count_reported(prod_values: dict[str, Any]) -> None:
    assert any("chunk-prefilled in 128 iterations" in n for n in plan_of(prod_values).notes)


def test_schema_errors_name_key_value_and_alternatives(prod_values: dict[str, Any]) -> None:
    prod_values["parallelism"]["tensor_paralel"] = 8
    prod_values["parallelism"]["backend"] = "slurm"
    prod_values["serving"]["gpu_memory_utilization"] = 1.5
    problems = problems_of(prod_values)
    typo = _only(problems, "parallelism.tensor_paralel")
    assert typo.message.startswith("unknown key") and "tensor" in (typo.fix or "")
    backend = _only(problems, "parallelism.backend")
    assert backend.value == "slurm" and "'mp'" in (backend.fix or "")
    assert "to 1" in (_only(problems, "serving.gpu_memory_utilization").fix or "")


def test_all_errors_reported_together(prod_values: dict[str, Any]) -> None:
    prod_values["parallelism"] |= {"tensor": 16, "data": 1}
    prod_values["serving"]["max_model_len"] = 2_000_000
    prod_values["nodes"][1]["name"] = "node1"
    keys = {p.key for p in problems_of(prod_values)}
    assert {"parallelism.tensor", "serving.max_model_len", "nodes.1.name"} <= keys


def test_image_as_one_pinned_string(prod_values: dict[str, Any]) -> None:
    digest = "sha256:" + "0123456789abcdef" * 4
    prod_values["image"] = f"registry.local:5000/vllm/vllm-openai:v0.33.0@{digest}"
    plan = plan_of(prod_values)
    assert plan.image["repository"] == "registry.local:5000/vllm/vllm-openai" and plan.image["tag"] == "v0.33.0"
    assert plan.image["digest"] == digest and plan.image["pull_ref"].endswith(f":v0.33.0@{digest}")
    assert not any("not pinned" in w for w in plan.warnings)
    prod_values["image"] = "registry.local:5000/vllm/vllm-openai"
    problem = problems_of(prod_values)[0]
    assert problem.key == "image" and "has no tag" in problem.message and "repo:tag@sha256" in (problem.fix or "")
    prod_values["image"] = "vllm/vllm-openai:v0.33.0@sha256:short"
    assert problems_of(prod_values)[0].key == "image.digest"


def test_a_node_address_outside_every_private_network_the_others_use_is_warned(prod_values: dict[str, Any]) -> None:
    """192.168.2.22 for 192.168.20.22: one digit dropped. The other node's same rail is in a private network, this
    one is in none: warned by key, value and node; the others and a rail nobody declared stay quiet."""
    def typos(values: dict[str, Any]) -> list[str]:
        return [w for w in plan_of(values).warnings if "a typo?" in w]

    assert typos(prod_values) == []
    prod_values["nodes"][1]["data_ips"][1] = "1.1.20.1"
    [warning] = typos(prod_values)
    assert warning.startswith("nodes.1.data_ips.1: 1.1.20.1 (") and "are: 1 in 1.1.2.0/24" in warning
    prod_values["fabric"]["private_networks"] = [*prod_values["fabric"]["private_networks"], "1.1.20.0/24"]
    prod_values["fabric"]["public_private_networks"] = [*prod_values["fabric"]["public_private_networks"],
                                                        "1.1.20.0/24"]
    assert typos(prod_values) == []


def test_a_mistyped_ipv4_address_is_not_taken_for_a_host_name(prod_values: dict[str, Any]) -> None:
    prod_values["nodes"][1]["ssh"]["host"] = "10.30.8.2l"   # a letter l for the digit 1
    [problem] = problems_of(prod_values)
    assert (problem.key, problem.value) == ("nodes.1.ssh.host", "10.30.8.2l")
    assert "mistyped IPv4" in problem.message
    for name in ("gpu-2.example.com", "1.2.3.example", "10.40.0.1e2"):   # real names, however odd
        prod_values["nodes"][1]["ssh"]["host"] = name
        assert plan_of(prod_values).nodes[1].host == name
    prod_values["nodes"][1]["ssh"]["host"] = "10.30.8.2 "                 # a trailing space, as in an IP field
    assert plan_of(prod_values).nodes[1].host == "10.30.8.2"


def test_a_data_ip_on_the_management_network_is_warned(prod_values: dict[str, Any]) -> None:
    """Node 2's data IP set to its own management IP while node 1's is on the data network: warned, naming both
    networks; the same data IPs on every node's management network (a single-network cluster) are quiet."""
    def typos(values: dict[str, Any]) -> list[str]:
        return [w for w in plan_of(values).warnings if "management network" in w]

    assert typos(prod_values) == []
    prod_values["nodes"][1]["data_ips"][0] = prod_values["nodes"][1]["management_ip"]
    [warning] = typos(prod_values)
    assert warning.startswith("nodes.1.data_ips.0: 10.30.8.2 (") and "10.30.8.0/24" in warning, warning
    assert "1.1.1.0/24" in warning
    prod_values["nodes"][0]["data_ips"][0] = "10.30.8.11"
    assert typos(prod_values) == []


def test_the_tensor_sizes_suggested_for_kv_heads_fit_the_stack(prod_values: dict[str, Any]) -> None:
    """qwen3-8b (32 heads, 8 KV heads) at TP3 on two 8-GPU nodes: the sizes offered are all at most 16 GPUs."""
    prod_values["model"] = {**prod_values["model"], "profile": "qwen3-8b"}
    prod_values["parallelism"] = {**prod_values["parallelism"], "tensor": 3, "expert": False}
    fixes = [p.fix or "" for p in problems_of(prod_values) if p.key == "parallelism.tensor"]
    offered = [int(n) for f in fixes for n in __import__("re").findall(r"\d+", f.partition("tensor in ")[2])]
    assert offered and max(offered) <= 16 and 8 in offered, fixes


def test_a_management_ip_in_the_data_network_or_apart_from_the_majority_is_warned(
        prod_values: dict[str, Any]) -> None:
    """Two nodes: a management IP typed into the data network is warned (the other role's network); four nodes
    with one elsewhere in a declared network: the majority decides; two and two: no majority, no warning."""
    def typos(values: dict[str, Any]) -> list[str]:
        return [w for w in plan_of(values).warnings if "a typo?" in w]

    values = copy.deepcopy(prod_values)
    values["nodes"][1]["management_ip"] = "1.1.1.50"
    [warning] = typos(values)
    assert warning.startswith("nodes.1.management_ip: 1.1.1.50 (") and "is on the data network 1.1.1.0/24" in warning
    values = copy.deepcopy(prod_values)
    values["nodes"] = [clone_node(values["nodes"][0], i) for i in range(4)]
    values["parallelism"] = values["parallelism"] | {"data": 4}
    values["fabric"]["private_networks"] = [*values["fabric"]["private_networks"], "10.30.9.0/24"]
    values["nodes"][3]["management_ip"] = values["nodes"][3]["ssh"]["host"] = "10.30.9.4"
    [warning] = typos(values)
    assert warning.startswith("nodes.3.management_ip: 10.30.9.4 (node4) is in 10.30.9.0/24, while the other nodes' "
                              "management_ip are: 3 in 10.30.8.0/24")
    values["nodes"][2]["management_ip"] = values["nodes"][2]["ssh"]["host"] = "10.30.9.3"
    assert typos(values) == []


def test_a_node_with_fewer_gpus_than_the_others_is_named_by_its_count(prod_values: dict[str, Any]) -> None:
    """prod is DP2 x TP8 on two 8-GPU nodes; node2 written with 6 GPUs: the refusal is keyed on that node's count
    (a typo there is likelier than a wrong TP), and the DP mapping's fix lists every node's count."""
    prod_values["nodes"][1]["gpus"]["count"] = 6
    problems = problems_of(prod_values)
    assert ("nodes.1.gpus.count", 6) in [(p.key, p.value) for p in problems], [p.render() for p in problems]
    assert not [p for p in problems if p.key == "parallelism.tensor"]

"""KV transfer between a prefill tier and a decode tier (stacks/model/kv_transfer_config.py,
stacks/planner/kv_transfer.py): each refusal of a tier pairing vLLM 0.33.0's NIXL connector would fail on, the
rendered `--kv-transfer-config` and per-node environment, hostile settings, and real vLLM 0.33.0's verdict on the
rendered argv (bench/kv_transfer_real_vllm.py -> tests/fixtures/vllm-0.33.0-kv-transfer.json)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from bench.kv_transfer_real_vllm import planned_argv, planned_settings
from bench.load_formats_real_vllm import lab_values
from stacks.model.config import StackConfig
from stacks.model.errors import Problem
from stacks.model.kv_transfer_config import KvTransferConfig
from stacks.model.loader import parse_config
from stacks.planner.kv_transfer import (
    kv_transfer_args,
    kv_transfer_json,
    kv_transfer_problems,
    kv_transfer_warnings,
    node_env,
    side_channels,
)
from tests.conftest import ROOT

CAPTURE = json.loads((ROOT / "tests" / "fixtures" / "vllm-0.33.0-kv-transfer.json").read_text())
PULL, PUSH = KvTransferConfig(), KvTransferConfig(connector="NixlPushConnector")


def tier(node: int, *, tensor: int = 1, pipeline: int = 1, data: int = 1, profile: str | None = None,
         extra_args: list[str] | None = None, env: dict[str, str] | None = None, **changes: Any) -> StackConfig:
    """One node of the lab stack as a real vLLM 0.33.0 tier (qwen3-8b unless `profile`), with the GPUs its shape
    needs; `changes` are top-level keys or `serving` keys."""
    values = lab_values()
    values["nodes"] = [values["nodes"][node]]
    values["nodes"][0]["gpus"] |= {"count": tensor * pipeline * data}
    values["parallelism"] |= {"tensor": tensor, "pipeline": pipeline, "data": data}
    if profile:
        values["model"] |= {"profile": profile}
    if extra_args:
        values["serving"]["extra_args"] = extra_args
    if env:
        values["container"]["env"] = env
    for key, value in changes.items():
        if key in StackConfig.model_fields:
            values[key] = value
        else:
            values["serving"][key] = value
    return parse_config("t", values)


def prefill(**kw: Any) -> StackConfig:
    return tier(0, **kw)


def decode(**kw: Any) -> StackConfig:
    return tier(1, **kw)


def keys(problems: list[Problem]) -> list[str]:
    return [p.key for p in problems]


def one(problems: list[Problem], key: str) -> Problem:
    found = [p for p in problems if p.key == key]
    assert len(found) == 1, [p.render() for p in problems]
    return found[0]


# --- pairs that work ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("settings", [PULL, PUSH,
                                      KvTransferConfig(buffer_device="cpu", load_failure_policy="recompute")])
def test_two_like_tiers_pair_with_either_connector(settings: KvTransferConfig) -> None:
    assert kv_transfer_problems(prefill(), decode(), settings) == []
    assert kv_transfer_warnings(prefill(), decode()) == []


@pytest.mark.parametrize(("p_tp", "d_tp"), [(1, 2), (2, 1), (2, 8), (8, 2)])
def test_tp_sizes_that_divide_pair_while_no_kv_head_is_replicated(p_tp: int, d_tp: int) -> None:
    """qwen3-8b has 8 KV heads: up to TP 8 on either side every rank holds whole heads (kv_connector/utils.py:522-539,
    nixl/base_worker.py:2724-2730)."""
    assert kv_transfer_problems(prefill(tensor=p_tp), decode(tensor=d_tp), PULL) == []


def test_auto_dtype_is_the_checkpoint_dtype_and_the_same_hma_switch_pairs() -> None:
    """`--dtype auto` hashes as the resolved dtype (nixl/metadata.py:192); the hybrid manager's switch is read as
    vLLM reads the flag family, so the enable spelling is the default."""
    assert kv_transfer_problems(prefill(dtype="auto"), decode(dtype="bfloat16"), PULL) == []
    assert kv_transfer_problems(prefill(extra_args=["--enable-hybrid-kv-cache-manager"]), decode(), PULL) == []


# --- what the compatibility hash compares ------------------------------------------------------------------------


@pytest.mark.parametrize(("change", "key"), [
    ({"image": "vllm/vllm-openai:v0.32.0"}, "image"),
    ({"dtype": "float16"}, "serving.dtype"),
    ({"kv_cache_dtype": "fp8"}, "serving.kv_cache_dtype"),
    ({"extra_args": ["--attention-backend", "FLASHINFER"]}, "serving.extra_args"),
    ({"extra_args": ["--disable-hybrid-kv-cache-manager"]}, "serving.extra_args"),
    ({"speculative": {"method": "eagle3", "num_speculative_tokens": 2}}, "speculative"),
])
def test_a_hash_factor_that_differs_between_tiers_is_refused(change: dict[str, Any], key: str) -> None:
    problem = one(kv_transfer_problems(prefill(), decode(**change), PULL), key)
    assert "compatibility hash" in problem.message
    assert problem.upstream is not None and "NIXL compatibility hash mismatch" in problem.upstream
    assert "base_worker.py:1193-1208" in problem.upstream and problem.fix


def test_another_model_or_another_path_is_refused() -> None:
    other = kv_transfer_problems(prefill(), decode(profile="llama-3.1-8b-instruct"), PULL)
    assert "model.profile" in keys(other)
    values = lab_values()
    values["nodes"] = [values["nodes"][1]]
    values["parallelism"] |= {"data": 1}
    values["model"] |= {"path": "qwen3-8b-copy"}
    moved = one(kv_transfer_problems(prefill(), parse_config("t", values), PULL), "model.path")
    assert moved.value == "/models/qwen3-8b" and "metadata.py:191" in moved.message


def test_a_speculative_method_outside_the_hash_is_not_compared() -> None:
    """Only EAGLE-style speculation enters the hash (vllm/config/speculative.py:2116-2120)."""
    ngram = {"method": "ngram", "num_speculative_tokens": 2}
    assert "speculative" not in keys(kv_transfer_problems(prefill(), decode(speculative=ngram), PULL))


# --- tensor, pipeline and context parallelism --------------------------------------------------------------------


def test_tp_sizes_that_do_not_divide_are_refused_with_vllms_assertion() -> None:
    problem = one(kv_transfer_problems(prefill(tensor=3), decode(tensor=2), PULL), "parallelism.tensor")
    assert problem.upstream is not None and problem.upstream.startswith(
        "AssertionError: Remote tensor parallel size 3 is not divisible by local tensor parallel size 2.")
    assert "decode TP 3 or 6" in (problem.fix or "")


def test_a_larger_prefill_tp_with_replicated_kv_heads_is_refused_for_the_pull_connector() -> None:
    """Prefill TP 16 > decode TP 2 and > 8 KV heads: the reading decode tier cannot gather replicated heads."""
    problem = one(kv_transfer_problems(prefill(tensor=16), decode(tensor=2), PULL), "parallelism.tensor")
    assert problem.value == 16 and "base_worker.py:2724-2730" in (problem.upstream or "")
    assert problem.fix == "prefill tier TP at most 8, or decode tier TP at least 16"


def test_with_the_push_connector_the_rule_runs_the_other_way() -> None:
    """The prefill tier adds the decode tier's agent when it writes (push_worker.py:347-358)."""
    assert kv_transfer_problems(prefill(tensor=16), decode(tensor=2), PUSH) == []
    problem = one(kv_transfer_problems(prefill(tensor=2), decode(tensor=16), PUSH), "parallelism.tensor")
    assert problem.value == 16 and "decode tier TP 16" in problem.message
    assert kv_transfer_problems(prefill(tensor=2), decode(tensor=16), PULL) == []


def test_an_mla_model_pairs_any_dividing_tp() -> None:
    """MLA replicates its one latent KV head on every rank (nixl/tp_mapping.py:107-117)."""
    assert kv_transfer_problems(prefill(tensor=16, profile="deepseek-v3"), decode(tensor=2, profile="deepseek-v3"),
                                PULL) == []


def test_an_nvfp4_kv_cache_is_refused_across_different_heads_per_rank() -> None:
    problem = one(kv_transfer_problems(prefill(kv_cache_dtype="nvfp4"), decode(tensor=2, kv_cache_dtype="nvfp4"),
                                       PULL), "serving.kv_cache_dtype")
    assert "base_worker.py:2862-2877" in (problem.upstream or "")
    assert kv_transfer_problems(prefill(kv_cache_dtype="nvfp4"), decode(kv_cache_dtype="nvfp4"), PULL) == []


def test_a_pipeline_parallel_decode_tier_is_refused_with_either_connector() -> None:
    for settings in (PULL, PUSH):
        problem = one(kv_transfer_problems(prefill(), decode(pipeline=2), settings), "parallelism.pipeline")
        assert problem.value == 2 and "base_worker.py:885-890" in (problem.upstream or "")


def test_a_pipeline_parallel_prefill_tier_needs_the_push_connector() -> None:
    problem = one(kv_transfer_problems(prefill(pipeline=2), decode(), PULL), "parallelism.pipeline")
    assert problem.fix == "disaggregation.connector: NixlPushConnector, or pipeline 1 on the prefill tier"
    assert kv_transfer_problems(prefill(pipeline=2), decode(), PUSH) == []


def test_prefill_context_parallelism_on_the_decode_tier_is_refused() -> None:
    problem = one(kv_transfer_problems(prefill(), decode(extra_args=["--prefill-context-parallel-size", "2"]), PULL),
                  "serving.extra_args")
    assert "connector.py:105-113" in (problem.upstream or "")
    assert kv_transfer_problems(prefill(extra_args=["--prefill-context-parallel-size", "2"]), decode(), PULL) == []


# --- block sizes, layout, host buffer ----------------------------------------------------------------------------


def test_the_reading_tiers_block_size_must_be_a_multiple_of_the_other() -> None:
    problem = one(kv_transfer_problems(prefill(extra_args=["--block-size", "32"]),
                                       decode(extra_args=["--block-size", "16"]), PULL), "serving.extra_args")
    assert "utils.py:541-547" in (problem.upstream or "")
    assert kv_transfer_problems(prefill(extra_args=["--block-size", "16"]),
                                decode(extra_args=["--block-size", "32"]), PULL) == []


def test_different_block_sizes_are_refused_with_a_larger_prefill_tp_or_a_host_buffer() -> None:
    sizes = {"p": ["--block-size", "16"], "d": ["--block-size", "32"]}
    larger = one(kv_transfer_problems(prefill(tensor=2, extra_args=sizes["p"]), decode(extra_args=sizes["d"]), PULL),
                 "serving.extra_args")
    assert "base_worker.py:2940-2944" in (larger.upstream or "")
    host = one(kv_transfer_problems(prefill(extra_args=sizes["p"]), decode(extra_args=sizes["d"]),
                                    KvTransferConfig(buffer_device="cpu")), "serving.extra_args")
    assert "base_worker.py:2780-2787" in (host.upstream or "")


def test_a_block_size_on_one_tier_only_is_a_warning() -> None:
    warnings = kv_transfer_warnings(prefill(extra_args=["--block-size", "32"]), decode())
    assert len(warnings) == 1 and "prefill tier only" in warnings[0]


def test_different_kv_cache_layouts_are_refused_unless_the_model_is_mla() -> None:
    problem = one(kv_transfer_problems(prefill(), decode(env={"VLLM_KV_CACHE_LAYOUT": "NHD"}), PULL),
                  "container.env.VLLM_KV_CACHE_LAYOUT")
    assert problem.value == "NHD" and "base_worker.py:2788-2814" in (problem.upstream or "")
    mla = {"profile": "deepseek-v3"}
    assert kv_transfer_problems(prefill(**mla), decode(env={"VLLM_KV_CACHE_LAYOUT": "NHD"}, **mla), PULL) == []


def test_a_host_buffer_is_refused_for_a_csa_linear_kv_cache() -> None:
    v41 = {"profile": "deepseek-v4.1-flash"}
    problem = one(kv_transfer_problems(prefill(**v41), decode(**v41), KvTransferConfig(buffer_device="cpu")),
                  "disaggregation.buffer_device")
    assert "base_worker.py:1514-1517" in (problem.upstream or "")
    assert kv_transfer_problems(prefill(**v41), decode(**v41), PULL) == []


def test_kv_offloading_on_a_tier_is_refused_because_vllm_replaces_the_connector() -> None:
    """Real vLLM 0.33.0 did exactly that to the producer's config (the capture)."""
    problem = one(kv_transfer_problems(prefill(extra_args=["--kv-offloading-size", "4"]), decode(), PULL),
                  "serving.extra_args")
    assert problem.message.startswith("prefill tier:") and "vllm.py:1151-1185" in (problem.upstream or "")
    real = CAPTURE["refused"]["--kv-offloading-size with the producer"]["ok"]
    assert (real["kv_connector"], real["kv_role"]) == ("OffloadingConnector", "kv_both")


# --- side channel: addresses and ports ---------------------------------------------------------------------------


def test_each_dp_rank_gets_its_own_side_channel_port() -> None:
    channels = side_channels(decode(data=2), PULL)
    assert [(c.node, c.host, c.first_port, c.last_port) for c in channels] == [("lab2", "10.231.0.2", 5600, 5601)]


def test_a_side_channel_range_past_65535_is_refused() -> None:
    problem = one(kv_transfer_problems(prefill(), decode(data=2), KvTransferConfig(side_channel_port=65535)),
                  "disaggregation.side_channel_port")
    assert problem.value == 65535 and problem.fix == "at most 65534"


@pytest.mark.parametrize("data", [1, 2])
def test_a_side_channel_port_on_the_api_port_is_refused_on_each_tier(data: int) -> None:
    """serving.port 8000 binds 0.0.0.0: side_channel_port 8000 (DP 1), or 7999 with DP 2 (ranks on 7999-8000)."""
    port = 8000 - (data - 1)
    problems = kv_transfer_problems(prefill(data=data), decode(data=data), KvTransferConfig(side_channel_port=port))
    assert keys(problems) == ["disaggregation.side_channel_port"] * 2
    assert [p.message.split(":")[0] for p in problems] == ["prefill tier", "decode tier"]
    assert all("OpenAI API" in p.message and "Address already in use" in p.message for p in problems)
    assert kv_transfer_problems(prefill(data=data), decode(data=data),
                                KvTransferConfig(side_channel_port=port - 1)) == []


def test_a_side_channel_port_on_the_dp_handshake_port_of_a_two_node_tier_is_refused() -> None:
    """A decode tier of two nodes, DP 2: its head listens on parallelism.data_parallel_rpc_port (29550) and, being
    the head of more than one node, on fabric.collective_port (29700) while the collective check runs."""
    values = lab_values()
    two = parse_config("t", values)
    for port, what in ((29550, "DP handshake"), (29700, "collective check")):
        problem = one(kv_transfer_problems(prefill(), two, KvTransferConfig(side_channel_port=port)),
                      "disaggregation.side_channel_port")
        assert "on lab1" in problem.message and what in problem.message


def test_the_side_channel_needs_an_address_on_its_network() -> None:
    values = lab_values()
    values["nodes"] = [values["nodes"][1] | {"data_ips": [], "nics": []}]
    values["parallelism"] |= {"data": 1}
    values["fabric"] |= {"control_plane": "management", "nccl_socket": "management"}
    values["nodes"][0]["management_ifname"] = "eth0"
    bare = parse_config("t", values)
    problem = one(kv_transfer_problems(prefill(), bare, KvTransferConfig(side_channel_network="data")),
                  "nodes.0.data_ips")
    assert problem.message.startswith("decode tier:")
    assert "nodes.0.data_ips" not in keys(kv_transfer_problems(prefill(), bare, PULL))


# --- rendering ---------------------------------------------------------------------------------------------------


def test_each_tier_renders_its_role_and_the_shared_settings() -> None:
    settings = KvTransferConfig(connector="NixlPushConnector", buffer_device="cpu", load_failure_policy="recompute")
    assert json.loads(kv_transfer_json(settings, "prefill")) == {
        "kv_connector": "NixlPushConnector", "kv_role": "kv_producer", "kv_buffer_device": "cpu",
        "kv_load_failure_policy": "recompute"}
    assert json.loads(kv_transfer_json(PULL, "decode")) == {
        "kv_connector": "NixlConnector", "kv_role": "kv_consumer", "kv_buffer_device": "cuda",
        "kv_load_failure_policy": "fail"}
    assert kv_transfer_args(PULL, "decode") == ["--kv-transfer-config", kv_transfer_json(PULL, "decode")]


def test_node_env_on_roce_lists_each_hca_port_and_the_gid() -> None:
    values = lab_values()
    values["nodes"] = [values["nodes"][0] | {"hcas": ["mlx5_0", "mlx5_1:2"], "gid_index": 3}]
    values["parallelism"] |= {"data": 1}
    values["fabric"] |= {"transport": "roce", "env": {"UCX_TLS": "rc,cuda_copy"}}
    config = parse_config("t", values)
    assert node_env(config, config.nodes[0], PULL) == {
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "10.231.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": "5600",
        "UCX_NET_DEVICES": "mlx5_0:1,mlx5_1:2", "UCX_IB_GID_INDEX": "3", "UCX_TLS": "rc,cuda_copy"}


def test_node_env_on_sockets_lists_the_data_nics_and_the_chosen_network() -> None:
    config = prefill()
    env = node_env(config, config.nodes[0], KvTransferConfig(side_channel_network="management", side_channel_port=7000))
    assert env == {"VLLM_NIXL_SIDE_CHANNEL_HOST": "10.231.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": "7000",
                   "UCX_NET_DEVICES": "lab0"}


def test_an_ipv6_node_gets_its_address_unbracketed() -> None:
    """vLLM brackets it when it forms the ZMQ path (make_zmq_path); the env holds the bare literal."""
    values = lab_values()
    values["nodes"] = [values["nodes"][0] | {"management_ip": "fd00::1", "data_ips": ["fd00::1"]}]
    values["parallelism"] |= {"data": 1}
    config = parse_config("t", values)
    assert node_env(config, config.nodes[0], PULL)["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "fd00::1"


# --- hostile settings --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("values", "says"), [
    ({"connector": ""}, "literal_error"),
    ({"connector": "NixlConnector" * 1000}, "literal_error"),
    ({"connector": "NixlConnéctor"}, "literal_error"),
    ({"connector": "NixlConnector;rm -rf /"}, "literal_error"),
    ({"connector": "NixlConnector\n"}, "literal_error"),
    ({"connector": "nixlconnector"}, "literal_error"),
    ({"connector": "LMCacheConnectorV1"}, "factory.py:165-169"),
    ({"connector": "MooncakeConnector"}, "factory.py:225-229"),
    ({"side_channel_port": -1}, "greater_than_equal"),
    ({"side_channel_port": 0}, "greater_than_equal"),
    ({"side_channel_port": 65536}, "less_than_equal"),
    ({"side_channel_port": "5600"}, "int_type"),
    ({"side_channel_port": True}, "int_type"),
    ({"side_channel_port": 5600.0}, "int_type"),
    ({"buffer_device": "xpu"}, "literal_error"),
    ({"buffer_device": "CUDA"}, "literal_error"),
    ({"load_failure_policy": "retry"}, "literal_error"),
    ({"side_channel_network": "public"}, "literal_error"),
    ({"engine_id": "p0"}, "extra_forbidden"),
    ({"kv_role": "kv_both"}, "extra_forbidden"),
])
def test_hostile_settings_are_refused(values: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError) as caught:
        KvTransferConfig.model_validate(values)
    error = caught.value.errors()[0]
    assert says in (error["type"], error["msg"]) or says in error["msg"], error


def test_the_defaults_are_vllms() -> None:
    """vllm/config/kv_transfer.py:88 (fail), envs.py:1725-1727 (5600), nixl/connector.py:12 (NixlConnector)."""
    assert (PULL.connector, PULL.buffer_device, PULL.load_failure_policy, PULL.side_channel_port) == (
        "NixlConnector", "cuda", "fail", 5600)


# --- real vLLM 0.33.0 on the rendered argv -----------------------------------------------------------------------


def test_the_capture_ran_the_argv_the_planner_renders_now() -> None:
    """Else recapture: `VLLM_PYTHON=/tmp/loaders-py venv/bin/python bench/kv_transfer_real_vllm.py > tests/fixtures/
    vllm-0.33.0-kv-transfer.json`."""
    assert CAPTURE["vllm_version"] == "0.33.0"
    assert {name: case["argv"] for name, case in CAPTURE["planned"].items()} == planned_argv()


@pytest.mark.parametrize("name", list(CAPTURE["planned"]))
def test_real_vllm_keeps_every_rendered_value_and_resolves_the_connector(name: str) -> None:
    tier_name, settings = planned_settings()[name]
    got = CAPTURE["planned"][name]
    assert "ok" in got, got
    assert {k: got["ok"][k] for k in ("kv_connector", "kv_role", "kv_buffer_device", "kv_load_failure_policy")} == \
        json.loads(kv_transfer_json(settings, tier_name))
    assert got["ok"]["engine_id_drawn"] and got["ok"]["kv_connector_extra_config"] == {}
    assert (got["ok"]["is_kv_producer"], got["ok"]["is_kv_consumer"]) == (tier_name == "prefill", tier_name == "decode")
    # NixlConnector is the pull connector the direction rules assume (nixl/connector.py:9-12)
    assert got["ok"]["connector_class"] == ("NixlPushConnector" if settings.push else "NixlPullConnector")


def test_the_capture_says_the_connector_itself_was_not_constructed() -> None:
    """No nixl package on the CPU interpreter: the handshake rules are read from the code, not run."""
    assert CAPTURE["nixl_importable"] is False


@pytest.mark.parametrize(("name", "says"), [
    ("connector without kv_role", "Please specify kv_role when kv_connector is set"),
    ("failure policy not in vLLM's list", "Input should be 'recompute' or 'fail'"),
    ("unregistered connector", "Unsupported connector type: NixlConnectr"),
])
def test_real_vllm_refuses_what_the_model_never_renders(name: str, says: str) -> None:
    assert says in CAPTURE["refused"][name]["message"]

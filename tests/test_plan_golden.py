"""Golden plans: the committed stacks reproduce the field reports flag by flag and variable by variable.

Expected values are typed from the seeds (shared/seeds/000_*, 001_*), not produced by the code under test.
"""

from __future__ import annotations

import json
from typing import Any

from stacks.model.loader import load_stack
from stacks.planner.launch import cache_key
from stacks.planner.plan import build_plan
from tests.conftest import flag_pairs

MODEL = "/models/deepseek-ai/DeepSeek-V4.1-Flash"
SPEC = ('{"method":"dspark","num_speculative_tokens":5,"draft_sample_method":"probabilistic",'
        '"rejection_sample_method":"block","enable_adaptive_verification":true}')

# seed 000, section 四 (head) — the compose `command:` list after the model path, in order
PROD_HEAD_FLAGS = [
    ("--host", "0.0.0.0"), ("--port", "8030"), ("--served-model-name", "DeepSeek-V4.1-Flash"),
    ("--tensor-parallel-size", "8"), ("--distributed-executor-backend", "mp"),
    ("--data-parallel-size", "2"), ("--data-parallel-size-local", "1"),
    ("--data-parallel-address", "1.1.1.2"), ("--data-parallel-rpc-port", "13399"),
    ("--data-parallel-backend", "mp"), ("--enable-expert-parallel", None),
    ("--max-model-len", "1048576"), ("--max-num-batched-tokens", "8192"), ("--max-num-seqs", "128"),
    ("--gpu-memory-utilization", "0.95"), ("--kv-cache-dtype", "fp8_ds_mla"), ("--enable-prefix-caching", None),
    ("--tokenizer-mode", "deepseek_v41"), ("--tool-call-parser", "deepseek_v41"),
    ("--enable-auto-tool-choice", None), ("--reasoning-parser", "deepseek_v41"), ("--speculative-config", SPEC),
]
# seed 000, section 五 (secondary)
PROD_SECONDARY_FLAGS = [
    ("--headless", None), ("--served-model-name", "DeepSeek-V4.1-Flash"),
    ("--tensor-parallel-size", "8"), ("--distributed-executor-backend", "mp"),
    ("--data-parallel-size", "2"), ("--data-parallel-size-local", "1"), ("--data-parallel-start-rank", "1"),
    ("--data-parallel-address", "1.1.1.2"), ("--data-parallel-rpc-port", "13399"),
    ("--data-parallel-backend", "mp"), ("--enable-expert-parallel", None),
    ("--max-model-len", "1048576"), ("--max-num-batched-tokens", "8192"), ("--max-num-seqs", "128"),
    ("--gpu-memory-utilization", "0.95"), ("--kv-cache-dtype", "fp8_ds_mla"), ("--enable-prefix-caching", None),
    ("--tokenizer-mode", "deepseek_v41"), ("--tool-call-parser", "deepseek_v41"),
    ("--enable-auto-tool-choice", None), ("--reasoning-parser", "deepseek_v41"), ("--speculative-config", SPEC),
]
PROD_COMMON_ENV = {
    "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "VLLM_ENGINE_READY_TIMEOUT_S": "3600",
    "VLLM_USE_RUST_FRONTEND": "1", "PYTHONUNBUFFERED": "1", "NCCL_DEBUG": "INFO",
    "NCCL_SOCKET_IFNAME": "=ens11np0,ens13np0", "GLOO_SOCKET_IFNAME": "ens11np0",
    "NCCL_IB_HCA": "=mlx5_0:1,mlx5_2:1", "NCCL_IB_DISABLE": "0",
}


def _prod() -> dict[str, Any]:
    return build_plan("prod", load_stack("prod")).to_json_dict()


def test_prod_topology_and_order() -> None:
    plan = _prod()
    assert plan["topology"] | {"gpus_per_node": None} == {
        "backend": "mp", "nodes": 2, "gpus_per_node": None, "gpus_used": 16, "tensor": 8, "pipeline": 1,
        "data": 2, "expert": 16, "label": "mp-dp2-tp8-pp1-ep16", "replica_nodes": 1}
    assert plan["topology"]["gpus_per_node"] == {"node1": 8, "node2": 8}
    assert plan["start_order"] == ["node2", "node1"]  # secondaries first, then the head (seed 六)
    assert [(n["name"], n["host"], n["role"]) for n in plan["nodes"]] == [
        ("node1", "10.30.8.1", "dp-head"), ("node2", "10.30.8.2", "headless-engine")]
    assert plan["image"]["ref"] == "vllm/vllm-openai:nightly-eed1f3d0c6043bd494424a22443ee198dd56f657"
    assert plan["endpoint"] == "http://10.30.8.1:8030"


def test_prod_head_argv_flag_by_flag() -> None:
    head = _prod()["nodes"][0]["containers"][0]
    assert head["vllm_args"][0] == MODEL
    assert flag_pairs(head["vllm_args"][1:]) == PROD_HEAD_FLAGS
    assert "--data-parallel-start-rank" not in head["vllm_args"]  # seed 十.1
    assert head["entrypoint"] is None and head["command"] == head["vllm_args"]  # image entrypoint is vllm serve
    assert json.loads(dict(PROD_HEAD_FLAGS)["--speculative-config"] or "")["num_speculative_tokens"] == 5


def test_prod_secondary_argv_flag_by_flag() -> None:
    node2 = _prod()["nodes"][1]["containers"][0]
    assert node2["vllm_args"][0] == MODEL
    assert flag_pairs(node2["vllm_args"][1:]) == PROD_SECONDARY_FLAGS


def test_prod_env_variable_by_variable() -> None:
    plan = _prod()
    assert plan["nodes"][0]["containers"][0]["env"] == {**PROD_COMMON_ENV, "VLLM_HOST_IP": "1.1.1.2"}
    assert plan["nodes"][1]["containers"][0]["env"] == {**PROD_COMMON_ENV, "VLLM_HOST_IP": "1.1.1.1"}


def test_prod_container_settings() -> None:
    for node in _prod()["nodes"]:
        c = node["containers"][0]
        assert c["name"] == "deepseek-v41-flash"
        assert c["image"] == "vllm/vllm-openai:nightly-eed1f3d0c6043bd494424a22443ee198dd56f657"
        assert (c["network_mode"], c["ipc_mode"], c["privileged"], c["gpus"], c["restart"]) == (
            "host", "host", True, "all", "unless-stopped")
        assert c["ulimits"] == {"memlock": [-1, -1], "stack": [67108864, 67108864]}
        key = cache_key(c["image"], c["entrypoint"], c["command"], c["env"])
        assert c["volumes"] == [
            {"host": "/mnt/disk2/modelscope/models", "container": "/models", "read_only": True},
            {"host": f"/root/vllm-cache/deepseek-v41-flash/{key}", "container": "/root/.cache", "read_only": False},
        ]
        assert c["shm_size_mb"] is None and c["devices"] == []
        assert c["labels"]["vllm-cluster.topology"] == "mp-dp2-tp8-pp1-ep16"


H20_SERVE_FLAGS = {
    "--host": "0.0.0.0", "--port": "8000", "--served-model-name": "DeepSeek-V4-Flash", "--trust-remote-code": None,
    "--distributed-executor-backend": "ray", "--tensor-parallel-size": "8", "--pipeline-parallel-size": "2",
    "--dtype": "auto", "--kv-cache-dtype": "fp8", "--max-model-len": "65536", "--gpu-memory-utilization": "0.88",
    "--max-num-seqs": "8", "--enable-expert-parallel": None, "--tokenizer-mode": "deepseek_v4",
    "--tool-call-parser": "deepseek_v4", "--enable-auto-tool-choice": None, "--reasoning-parser": "deepseek_v4",
}
H20_COMMON_ENV = {
    "VLLM_ENGINE_READY_TIMEOUT_S": "3600", "NCCL_DEBUG": "INFO", "NCCL_NET": "IB", "NCCL_SOCKET_IFNAME": "=bond0",
    "GLOO_SOCKET_IFNAME": "bond0", "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1", "NCCL_IB_GID_INDEX": "3",
    "NCCL_IB_DISABLE": "0", "NCCL_ASYNC_ERROR_HANDLING": "1",
}


def _h20() -> dict[str, Any]:
    return build_plan("h20", load_stack("h20")).to_json_dict()


def test_h20_topology_and_order() -> None:
    plan = _h20()
    assert {k: plan["topology"][k] for k in ("backend", "nodes", "tensor", "pipeline", "data", "expert")} == {
        "backend": "ray", "nodes": 2, "tensor": 8, "pipeline": 2, "data": 1, "expert": 8}
    assert plan["start_order"] == ["h20-1", "h20-2"]  # head, then workers (seed 001 五)
    assert [n["role"] for n in plan["nodes"]] == ["ray-head", "ray-worker"]


def test_h20_serve_flags_and_ray_commands() -> None:
    head, worker = (n["containers"][0] for n in _h20()["nodes"])
    pairs = flag_pairs(head["vllm_args"][1:])
    assert head["vllm_args"][0] == "/data/models/DeepSeek-V4-Flash"
    assert dict(pairs) == H20_SERVE_FLAGS and len(pairs) == len(H20_SERVE_FLAGS)
    script = head["command"][0].splitlines()
    assert head["entrypoint"] == ["/bin/bash", "-c"]
    assert script[1].startswith("ray start --head --node-ip-address=192.0.2.11 --port=6379 --num-gpus=8")
    assert "want_n,want_g,deadline=2,16," in script[2] or "want_n,want_g,deadline=2,16," in head["command"][0]
    assert script[-1].startswith("exec vllm serve /data/models/DeepSeek-V4-Flash --host 0.0.0.0 --port 8000")
    assert head["command"][0].index("ray start") < head["command"][0].index("[cluster-ready]") < \
        head["command"][0].index("exec vllm serve")
    assert worker["vllm_args"] is None
    assert worker["entrypoint"] == ["ray"]
    # Every Ray port pinned so the host firewall can name it (stacks/planner/listeners.py RAY_PORTS); the worker range
    # is `ray start`'s own default made explicit.
    ray_ports = ["--node-manager-port=6380", "--object-manager-port=6381", "--runtime-env-agent-port=6382",
                 "--dashboard-agent-grpc-port=6383", "--dashboard-agent-listen-port=52365",
                 "--metrics-export-port=6384", "--min-worker-port=10002", "--max-worker-port=19999"]
    assert worker["command"] == ["start", "--address=192.0.2.11:6379", "--node-ip-address=192.0.2.12",
                                 "--num-gpus=8", *ray_ports, "--disable-usage-stats", "--block"]
    assert script[1].endswith("--ray-client-server-port=10001 " + " ".join(ray_ports) + " --disable-usage-stats")


def test_h20_env_and_container() -> None:
    plan = _h20()
    for node, ip in zip(plan["nodes"], ("192.0.2.11", "192.0.2.12"), strict=True):
        c = node["containers"][0]
        assert c["env"] == {**H20_COMMON_ENV, "VLLM_HOST_IP": ip}
        assert c["shm_size_mb"] == 262144 and c["ipc_mode"] == "host" and c["privileged"] is False
        assert c["devices"] == ["/dev/infiniband"] and c["capabilities"] == ["IPC_LOCK"]
        assert c["ulimits"] == {"memlock": [-1, -1], "stack": [67108864, 67108864]}
        assert {"host": "/data/models", "container": "/data/models", "read_only": True} in c["volumes"]
        assert {"host": "/dev/infiniband", "container": "/dev/infiniband", "read_only": False} in c["volumes"]


def test_generation_label_shared_by_the_group() -> None:
    for plan in (_prod(), _h20()):
        gens = {n["containers"][0]["labels"]["vllm-cluster.generation"] for n in plan["nodes"]}
        assert len(gens) == 1

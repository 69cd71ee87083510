"""Shell commands for every planned check, built from the plan (pure: no Pulumi imports).

Host-side checks are shipped as one stdlib-only script through a heredoc and wrapped in `timeout`, because
remote commands ignore Pulumi's own timeouts.
"""

from __future__ import annotations

import shlex

from checks.bundle import heredoc_command
from stacks.config import StackConfig
from stacks.plan import CheckSpec, Plan
from stacks.profiles import get_profile
from stacks.proxy import DENIED_PATHS

PREFLIGHT_TIMEOUT_S = 900
DRY_RUN_TIMEOUT_S = 600
"""Importing vLLM (torch, CUDA libraries) from a cold page cache takes a minute or two."""
EXPECTED_FIELDS = {
    "--tensor-parallel-size": "tensor_parallel_size", "--pipeline-parallel-size": "pipeline_parallel_size",
    "--data-parallel-size": "data_parallel_size", "--data-parallel-size-local": "data_parallel_size_local",
    "--data-parallel-start-rank": "data_parallel_start_rank", "--host": "host", "--port": "port",
    "--max-model-len": "max_model_len", "--max-num-seqs": "max_num_seqs",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--nnodes": "nnodes", "--node-rank": "node_rank", "--master-addr": "master_addr", "--master-port": "master_port",
}
"""Flags whose parsed value must come out exactly as planned (vLLM's argparse dest names)."""
EVIDENCE_TIMEOUT_S = 300
TLS_CA_ENV = "VLLM_TLS_CA"
API_PYTHON = "venv/bin/python"
"""The deployer's interpreter: Pulumi's pip toolchain creates venv/ (Pulumi.yaml)."""


def preflight_command(config: StackConfig, plan: Plan, check: CheckSpec) -> str:
    """Only the arguments the check's sections read, so e.g. an image change does not re-run the fabric check."""
    node = next(n for n in config.nodes if n.name == check.node)
    sections = set(check.sections)
    profile = get_profile(config.model.profile)
    args = ["--name", check.name, "--sections", ",".join(check.sections)]
    if sections & {"gpu", "toolkit"}:
        args += ["--gpus", str(node.gpus.count)]
    if "gpu" in sections:
        args += ["--gpu-model", node.gpus.model, "--gpu-memory-gb", f"{node.gpus.memory_gb:g}"]
    if sections & {"toolkit", "memlock"}:
        args += ["--image", config.image.pull_ref]
    if "model" in sections:
        args += ["--model-dir", config.model.host_path]
        if profile is not None:
            args += ["--heads", str(profile.num_attention_heads)]
            if profile.o_groups is not None:
                args += ["--o-groups", str(profile.o_groups)]
    if sections & {"hca", "gid"}:
        args += ["--hcas", ",".join(node.hcas)]
    if "hca" in sections:
        args += ["--link-layer", "InfiniBand" if config.fabric.transport == "ib" else "Ethernet"]
    if "gid" in sections and node.gid_index is not None:
        args += ["--gid-index", str(node.gid_index)]
    if "sysctl" in sections:
        args += ["--nics", ",".join(node.nics)]
    assert plan.node(node.name).gpus_present == node.gpus.count
    return heredoc_command("preflight", args, timeout_s=PREFLIGHT_TIMEOUT_S)


def dry_run_command(config: StackConfig, plan: Plan, check: CheckSpec) -> str:
    """`docker run --rm -i --network none --pull never --entrypoint python3 <new image> - …`: no GPU, no network,
    the node's own non-secret env, and the node's `vllm serve` argv after `--`."""
    node = plan.node(str(check.node))
    spec = node.containers[0]
    image = config.image.pull_ref
    env = [part for key, value in spec.env.items() for part in ("-e", f"{key}={value}")]  # plain env only
    # Without a GPU vLLM cannot even build its parser ("Failed to infer device type"); the CPU platform
    # builds the same serve parser. Seen with vLLM 0.33.0 (bench/dry_run_real_vllm.py).
    env += ["-e", "VLLM_TARGET_DEVICE=cpu"]
    prefix = shlex.join(["docker", "run", "--rm", "-i", "--network", "none", "--pull", "never",
                         "--entrypoint", "python3", *env, image]) + " "
    args = ["--name", check.name, "--image", image]
    if spec.vllm_args is None:
        args += ["--import-only", "vllm,ray"]
    else:
        argv = spec.vllm_args
        for flag, dest in EXPECTED_FIELDS.items():
            if flag in argv and argv.index(flag) + 1 < len(argv):
                args += ["--expect", f"{dest}={argv[argv.index(flag) + 1]}"]
        args += ["--", *argv]
    return heredoc_command("vllm_args", args, prefix=prefix, timeout_s=DRY_RUN_TIMEOUT_S, interpreter="")


def ray_ready_command(config: StackConfig, plan: Plan) -> str:
    container = plan.head.containers[0].name
    args = ["--name", "ray-cluster", "--address", "auto", "--nodes", str(len(plan.nodes)),
            "--gpus", str(plan.topology["gpus_used"]), "--wait-s", str(config.ray.cluster_ready_timeout_s),
            "--interval-s", "10"]
    return heredoc_command("ray_cluster", args, prefix=f"docker exec -i {shlex.quote(container)} ",
                           timeout_s=config.ray.cluster_ready_timeout_s + 120)


def nccl_command(config: StackConfig, plan: Plan, check: CheckSpec) -> str:
    container = plan.node(str(check.node)).containers[0].name
    transport = "ib" if config.fabric.transport == "ib" else "roce"
    return heredoc_command("nccl_transport", ["--name", check.name, "--container", container,
                                              "--transport", transport], timeout_s=EVIDENCE_TIMEOUT_S)


def engines_command(plan: Plan, check: CheckSpec) -> str:
    node = plan.node(str(check.node))
    args = ["--name", check.name, "--container", node.containers[0].name, "--ranks", ",".join(map(str, node.dp_ranks))]
    if "workers" in check.sections:  # a replica spans nodes: this node's own workers are evidence too
        args += ["--workers", str(node.gpus_used)]
    return heredoc_command("engines", args, timeout_s=EVIDENCE_TIMEOUT_S)


def health_deadline_s(config: StackConfig) -> int:
    return config.api.health_timeout_s or config.serving.engine_ready_timeout_s + 600


def api_command(config: StackConfig, plan: Plan, sections: list[str], name: str) -> str:
    """Runs on the deployer; the key arrives in VLLM_API_KEY (with the proxy: the check client's key) and the
    proxy's certificate in VLLM_TLS_CA, both through the command's environment."""
    args = [API_PYTHON, "-m", "checks.api", "--name", name, "--url", plan.endpoint,
            "--served-name", config.model.served_name, "--sections", ",".join(sections),
            "--deadline-s", str(health_deadline_s(config)), "--interval-s", str(config.api.progress_interval_s),
            "--timeout-s", str(config.api.request_timeout_s), "--prompt", config.api.smoke.prompt,
            "--expect", config.api.smoke.expect]
    if plan.proxy is not None and plan.proxy.tls:
        args += ["--ca-env", TLS_CA_ENV]
    if "deny" in sections:
        args += ["--deny-paths", ",".join(DENIED_PATHS)]
    return shlex.join(args)

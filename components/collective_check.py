"""What each node runs for the collective check (pure): the `docker run` in the stack's image, the node's
fabric env exactly as `stacks/planner/fabric.py` renders it, and the `checks.collective` arguments.

The command is `docker run … --entrypoint python3 IMAGE - ARGS` with the check's script on stdin
(`checks.bundle.heredoc_command("collective", args, prefix=…, interpreter="")`). Node rank 0 is the head; the
rendezvous address is its control IP (`VLLM_HOST_IP`), on `DEFAULT_MASTER_PORT` unless told otherwise.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from checks.collective import DEFAULT_MASTER_PORT, DEFAULT_SIZES
from stacks.model.config import StackConfig
from stacks.planner.container_spec import LABEL_PREFIX
from stacks.planner.fabric import control_ip, node_env
from stacks.planner.plan import Plan

COLLECTIVE_TIMEOUT_S = 900
"""Outer `timeout` of each node's command: image start, torch import, rendezvous (600 s) and the sizes."""
REHEARSAL_SIZES = "1M,4M,16M"
"""A rehearsal's message sizes (gloo between CPUs: the larger ones would take minutes and measure no fabric)."""


@dataclass(frozen=True)
class CollectiveRun:
    node: str
    node_rank: int
    env: dict[str, str]
    args: list[str]
    docker: list[str]

    @property
    def prefix(self) -> str:
        """For `heredoc_command(..., prefix=run.prefix, interpreter="")`."""
        return shlex.join(self.docker) + " "


def collective_runs(config: StackConfig, plan: Plan, *, min_busbw_gbps: float | None = None,
                    sizes: str | None = None, master_port: int = DEFAULT_MASTER_PORT, backend: str | None = None,
                    timeout_s: int = 600) -> list[CollectiveRun]:
    """One run per node, in node order (node rank = index; the head is 0). `min_busbw_gbps` None means the
    check's default for `fabric.transport`. `backend` and `sizes` None: nccl over DEFAULT_SIZES, or on a rehearsal
    (no GPUs, stacks/planner/rehearsal.py) gloo on CPU over REHEARSAL_SIZES with `--rehearsal`, so the line says
    that NCCL on GPUs did not run."""
    if config.rehearsal and backend == "nccl":
        raise ValueError("a rehearsal stack has no GPUs: the collective check runs gloo")
    backend = backend or ("gloo" if config.rehearsal else "nccl")
    sizes = sizes or (REHEARSAL_SIZES if config.rehearsal else DEFAULT_SIZES)
    head_ip = control_ip(config, config.head)
    if head_ip is None:
        raise ValueError("the head has no control IP (fabric.control_plane): nowhere to rendezvous")
    runs = []
    for rank, node in enumerate(config.nodes):
        node_plan = plan.node(node.name)
        spec = node_plan.containers[0]
        # The engine's own values: container.managed_env_overrides may replace a rendered fabric variable.
        env = {key: spec.env.get(key, value) for key, value in node_env(config, node).items()}
        if len(node_plan.containers) == 1 and "CUDA_VISIBLE_DEVICES" in spec.env:
            env["CUDA_VISIBLE_DEVICES"] = spec.env["CUDA_VISIBLE_DEVICES"]
        elif "CUDA_VISIBLE_DEVICES" in spec.env:  # external: every GPU of the node's rank containers, in order
            gpus = {g for c in node_plan.containers for g in c.env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g}
            env["CUDA_VISIBLE_DEVICES"] = ",".join(sorted(gpus, key=lambda g: (not g.isdigit(), int(g) if g.isdigit()
                                                                              else 0, g)))
        procs = node_plan.gpus_used if backend == "nccl" else 1
        args = ["--name", f"collective-{node.name}", "--nnodes", str(len(config.nodes)), "--node-rank", str(rank),
                "--master-addr", head_ip, "--master-port", str(master_port), "--procs-per-node", str(procs),
                "--backend", backend, "--transport", config.fabric.transport, "--sizes", sizes,
                "--timeout-s", str(timeout_s)]
        if min_busbw_gbps is not None:
            args += ["--min-busbw-gbps", f"{min_busbw_gbps:g}"]
        if config.rehearsal:
            args.append("--rehearsal")
        # The stack label: a run left behind (the deployer died mid-check) is this stack's to the ownership preflight.
        docker = ["docker", "run", "--rm", "-i", "--name", f"{config.container.name}-collective",
                  "--label", f"{LABEL_PREFIX}.stack={plan.stack}", "--network", "host", "--ipc", spec.ipc_mode,
                  "--pull", "never"]
        if spec.privileged:
            docker.append("--privileged")
        if backend == "nccl":
            docker += ["--gpus", spec.gpus or "all"]
        if spec.shm_size_mb:
            docker += ["--shm-size", f"{spec.shm_size_mb}m"]
        for name, (soft, hard) in spec.ulimits.items():
            docker += ["--ulimit", f"{name}={soft}:{hard}"]
        for device in spec.devices:
            docker += ["--device", device]
        for capability in spec.capabilities:
            docker += ["--cap-add", capability]
        for key, value in env.items():
            docker += ["-e", f"{key}={value}"]
        docker += ["--entrypoint", "python3", config.image.pull_ref]  # as the dry run: pulled by <node>-image
        runs.append(CollectiveRun(node.name, rank, env, args, docker))
    return runs

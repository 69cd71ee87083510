"""The launch plan: everything that will run, on which node, in which order, and how it is verified.

`build_plan` is the one entry point used by `python -m stacks plan`, by the Pulumi program and by the
diff/rollback tools, so what a reviewer reads is what gets deployed.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from stacks.config import StackConfig
from stacks.errors import ConfigError
from stacks.fabric import control_ip
from stacks.images import get_capabilities
from stacks.launch import ContainerSpec, engine_containers
from stacks.topology import Topology
from stacks.validation import validate

NODE_PREFLIGHT = ("gpu", "toolkit", "memlock", "model", "disk")
FABRIC_PREFLIGHT = ("infiniband", "hca", "gid", "sysctl")
API_CHECKS = ("health", "models", "chat", "thinking", "stream")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class CheckSpec(_Frozen):
    name: str
    node: str | None
    runs_on: str
    module: str
    sections: list[str]
    proves: str


class Listener(_Frozen):
    """A port something listens on, where, and on which network: reviewers check nothing internal is public."""

    node: str
    port: int
    bind: str
    network: str
    purpose: str
    public: bool


class NodePlan(_Frozen):
    name: str
    host: str
    role: str
    gpus_present: int
    gpus_used: int
    dp_ranks: list[int]
    dp_start_rank: int | None
    containers: list[ContainerSpec]


class Plan(_Frozen):
    stack: str
    image: dict[str, Any]
    model: dict[str, Any]
    topology: dict[str, Any]
    start_order: list[str]
    nodes: list[NodePlan]
    checks: list[CheckSpec]
    listeners: list[Listener]
    endpoint: str
    warnings: list[str]
    notes: list[str]

    def node(self, name: str) -> NodePlan:
        return next(n for n in self.nodes if n.name == name)

    @property
    def head(self) -> NodePlan:
        return self.nodes[0]

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def build_plan(stack: str, config: StackConfig) -> Plan:
    """Validate and derive the whole plan; raises ConfigError with every problem at once."""
    topo, profile, result = validate(config)
    if not result.ok or profile is None:
        raise ConfigError(stack, result.problems)
    containers = engine_containers(stack, config, profile, topo)
    caps = get_capabilities(config.image.ref)
    weights = config.model.weights_gb or profile.weights_gb
    nodes = [
        NodePlan(name=n.name, host=cfg.ssh.host, role=n.role.value, gpus_present=n.gpus_present,
                 gpus_used=n.gpus_used, dp_ranks=n.dp_ranks, dp_start_rank=n.dp_start_rank,
                 containers=containers[n.name])
        for n, cfg in zip(topo.nodes, config.nodes, strict=True)
    ]
    public_host = config.api.public_host or config.head.management_ip
    return Plan(
        stack=stack,
        image={
            "repository": config.image.repository, "tag": config.image.tag, "digest": config.image.digest,
            "ref": config.image.ref, "pull_ref": config.image.pull_ref, "known": caps is not None,
            "vllm_version": caps.vllm_version if caps else None,
        },
        model={"profile": profile.key, "served_name": config.model.served_name,
               "host_path": config.model.host_path, "container_path": config.model.container_path,
               "weights_gb": weights},
        topology=topology_summary(topo),
        start_order=list(topo.start_order),
        nodes=nodes,
        checks=planned_checks(config, topo),
        listeners=listeners(config, topo),
        endpoint=f"http://{public_host}:{config.serving.port}",
        warnings=result.warnings + _unverified(config, topo),
        notes=result.notes,
    )


def _unverified(config: StackConfig, topo: Topology) -> list[str]:
    if len(topo.nodes) > 1 and config.fabric.transport != "socket" and config.fabric.nccl_debug != "INFO":
        return ["fabric.nccl_debug is not INFO: the NCCL transport (RDMA vs socket fallback) will not be verified"]
    return []


def topology_summary(topo: Topology) -> dict[str, Any]:
    return {
        "backend": topo.backend,
        "nodes": len(topo.nodes),
        "gpus_per_node": {n.name: n.gpus_present for n in topo.nodes},
        "gpus_used": topo.gpus_used,
        "tensor": topo.tensor,
        "pipeline": topo.pipeline,
        "data": topo.data,
        "expert": topo.expert_size,
        "label": topo.label,
    }


def planned_checks(config: StackConfig, topo: Topology) -> list[CheckSpec]:
    checks: list[CheckSpec] = []
    for node in config.nodes:
        checks.append(CheckSpec(name=f"preflight-{node.name}", node=node.name, runs_on="node",
                                module="checks.preflight", sections=list(NODE_PREFLIGHT),
                                proves="GPUs, container toolkit, memlock, model files, disk"))
        if config.fabric.transport != "socket":
            checks.append(CheckSpec(name=f"fabric-{node.name}", node=node.name, runs_on="node",
                                    module="checks.preflight", sections=list(FABRIC_PREFLIGHT),
                                    proves="/dev/infiniband, HCA ports active, RoCE v2 GID, multi-NIC sysctls"))
    if topo.backend == "ray":
        checks.append(CheckSpec(name="ray-cluster", node=topo.head.name, runs_on="node", module="checks.ray_cluster",
                                sections=[], proves=f"Ray sees {len(topo.nodes)} nodes and {topo.gpus_used} GPUs"))
    checks += [
        CheckSpec(name=f"api-{c}", node=None, runs_on="deployer", module="checks.api", sections=[c],
                  proves=_API_PROVES[c])
        for c in API_CHECKS
        if (c != "thinking" or config.api.smoke.thinking_check) and (c != "stream" or config.api.smoke.stream_check)
    ]
    if topo.backend == "mp" and topo.data > 1:
        checks += [
            CheckSpec(name=f"dp-engines-{n.name}", node=n.name, runs_on="node", module="checks.engines",
                      sections=[], proves=f"DP rank(s) {n.dp_ranks} loaded and joined (of {topo.data})")
            for n in topo.nodes
        ]
    for name in nccl_evidence_nodes(config, topo):
        checks.append(CheckSpec(name=f"nccl-transport-{name}", node=name, runs_on="node",
                                module="checks.nccl_transport", sections=[],
                                proves="NCCL uses IB/RoCE with GPU Direct RDMA, not a socket fallback"))
    return checks


def nccl_evidence_nodes(config: StackConfig, topo: Topology) -> list[str]:
    """Whose container log holds NCCL's network lines: every node with mp; the head with Ray, whose driver
    receives the Ray workers' output. None where no evidence can exist (one node, sockets, NCCL_DEBUG off)."""
    if len(topo.nodes) < 2 or config.fabric.transport == "socket" or config.fabric.nccl_debug != "INFO":
        return []
    return [topo.head.name] if topo.backend == "ray" else [n.name for n in topo.nodes]


_API_PROVES = {
    "health": "/health answers 200 (the engine finished loading)",
    "models": "/v1/models lists the served name",
    "chat": "17*19 answers 323 with thinking off, temperature 0",
    "thinking": "thinking on returns reasoning content",
    "stream": "streaming returns SSE chunks and [DONE]",
}


def listeners(config: StackConfig, topo: Topology) -> list[Listener]:
    out: list[Listener] = []
    head = config.head
    bind = config.serving.host
    out.append(Listener(node=head.name, port=config.serving.port, bind=bind,
                        network="all" if bind in ("0.0.0.0", "::") else bind, purpose="OpenAI API (vLLM)",
                        public=bind in ("0.0.0.0", "::")))
    ip = str(control_ip(config, head))
    if topo.backend == "mp" and topo.data > 1:
        out.append(Listener(node=head.name, port=config.parallelism.data_parallel_rpc_port, bind=ip,
                            network=config.fabric.control_plane, purpose="DP coordinator RPC (unauthenticated)",
                            public=False))
    if topo.backend == "ray":
        out.append(Listener(node=head.name, port=config.ray.gcs_port, bind=ip, network=config.fabric.control_plane,
                            purpose="Ray GCS (unauthenticated)", public=False))
        out.append(Listener(node=head.name, port=config.ray.dashboard_port, bind="127.0.0.1", network="loopback",
                            purpose="Ray dashboard/jobs (remote code execution)", public=False))
        out.append(Listener(node=head.name, port=config.ray.client_port, bind=ip,
                            network=config.fabric.control_plane, purpose="Ray client server", public=False))
    return out


def roles(plan: Plan) -> dict[str, str]:
    return {n.name: n.role for n in plan.nodes}

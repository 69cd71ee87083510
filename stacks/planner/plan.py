"""The launch plan: everything that will run, on which node, in which order, and how it is verified.

`build_plan` is the one entry point used by `python -m stacks plan`, by the Pulumi program and by the
diff/rollback tools, so what a reviewer reads is what gets deployed.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict

from stacks.model.config import NodeConfig, StackConfig
from stacks.model.errors import ConfigError, Problem
from stacks.model.field_types import bracket_host
from stacks.model.kv_transfer_config import DisaggregationConfig
from stacks.model.project import STACKS, STACKS_VENV
from stacks.planner import deepep
from stacks.planner.addresses import rank_port
from stacks.planner.container_spec import GENERATION_LABEL, LABEL_PREFIX, ContainerSpec
from stacks.planner.firewall import FirewallPlan, firewall_plan
from stacks.planner.groups import GroupContext
from stacks.planner.image_capabilities import get_capabilities
from stacks.planner.image_cards import shadowed_cards
from stacks.planner.kv_transfer import Tier, side_channel_listeners
from stacks.planner.kv_transfer import node_env as kv_node_env
from stacks.planner.launch import engine_containers
from stacks.planner.listeners import (
    SRC_ROUTER,
    Listener,
    collapse,
    ephemeral_port_warnings,
    internal_sources,
    listener_problems,
    listener_table,
)
from stacks.planner.load_estimate import EngineMemory, engine_memory, estimated_load_s, memory_table, rank_copy_gb
from stacks.planner.managed_options import image_card, rendered_argv_problems
from stacks.planner.model_cards import CardProblem, get_profile, shadowed_card, thinking_request
from stacks.planner.observability import ObservabilityPlan, observability_plan
from stacks.planner.outage import outage_plan
from stacks.planner.proxy import front_door
from stacks.planner.rehearsal import DEEPEP_NOT_RUN, IMAGE_NEEDS, MIN_BUSBW_GBPS, PREFLIGHT_NOT_RUN
from stacks.planner.topology import NodeTopology, Role, Topology, endpoint_rank_nodes
from stacks.planner.validation import validate

FABRIC_PREFLIGHT = ("infiniband", "hca", "gid", "sysctl")
BEFORE_PULL = ("ownership", "disk", "gpu", "model")
"""= checks.preflight.BEFORE_PULL: the host preflight's sections that need no image (a test keeps them equal;
`stacks/` must plan without `checks/` beside it, see review.git_base)."""
AFTER_PULL = ("toolkit", "memlock")
"""= checks.preflight.AFTER_PULL."""
DEFAULT_MIN_BUSBW_GBPS = {"socket": 5.0, "roce": 50.0, "ib": 100.0}
"""= checks.collective.DEFAULT_MIN_BUSBW_GBPS: the collective check's floor per transport, in Gb/s
(docs/checks-by-hand.md)."""
API_CHECKS = ("health", "models", "chat", "thinking", "stream", "auth", "deny")
RANKED_API_CHECKS = ("chat", "thinking", "stream")
"""Sections `checks.api` runs once per DP rank (`--dp-size`): the plan lists them per rank (`api-golden-rank-<r>`)."""
WEIGHTS_LABEL = f"{LABEL_PREFIX}.weights-source"
"""Engine label holding the digest of `model.source`'s identity (url, endpoint, region), folded into the
group's generation: a new checkpoint synced into the same directory must replace every engine at once."""


def node_preflight_sections(config: StackConfig) -> tuple[list[str], list[str]]:
    """(before the image pull, after it). The weights command sits between the two with a `model.source`:
    the sync runs in the stack's image, and the `model` section reads the files it writes. Without a source
    the completeness check runs on the node's python3 first and `model` stays before the pull, so a node
    missing a shard fails before ~20 GB are downloaded."""
    if config.model.source is None:
        return list(BEFORE_PULL), list(AFTER_PULL)
    return [s for s in BEFORE_PULL if s != "model"], ["model", *AFTER_PULL]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class CheckSpec(_Frozen):
    name: str
    node: str | None
    runs_on: str
    module: str
    sections: list[str]
    proves: str


class ProxyPlan(_Frozen):
    """The nginx front door as a reviewer needs it: where it listens, who may call, what it refuses."""

    node: str
    container: str
    image: str
    listen: str
    tls: bool
    server_name: str | None
    """nginx's server_name (a change rewrites nginx.conf: the proxy container is replaced)."""
    upstream: str
    clients: list[str]
    check_client: str
    allowed_paths: list[str]
    open_paths: list[str]
    denied_paths: list[str]
    denied_from: str
    """Where the deny list comes from: the image's routes table (read from its wheel) or the built-in list."""
    limits: dict[str, int]
    max_body_mb: int
    read_timeout_s: int


class NodePlan(_Frozen):
    name: str
    host: str
    role: str
    gpus_present: int
    gpus_used: int
    dp_ranks: list[int]
    dp_start_rank: int | None
    containers: list[ContainerSpec]
    node_rank: int | None = None
    """`--node-rank` where a replica spans nodes (mp), else None."""
    replica: int | None = None
    """The DP rank whose replica this node serves, where a replica spans nodes."""


class MemorySummary(_Frozen):
    """The memory model's figures for one GPU of the node with the smallest GPUs (every node runs the same shard
    layout), and the pinned host memory each node needs for Engram tables kept off the GPU."""

    node: str
    gpu_gb: float
    utilization: float
    budget_gb: float
    """gpu_gb x utilization: what vLLM may use."""
    weights_gb: float
    kv_one_sequence_gb: float
    reserve_gb: float
    per_gpu_gb: float
    """weights + KV of one max_model_len sequence + runtime reserve."""
    left_gb: float
    """budget - per_gpu: room for the KV cache of concurrent sequences."""
    engram: str
    """Where the Engram tables live: gpu, host (pinned memory) or none (the model has none)."""
    host_pinned_gb_per_node: float


class PlanSummary(_Frozen):
    """What `python -m stacks plan` prints first, as data (`plan --json` key `summary`)."""

    memory: MemorySummary
    roles: dict[str, list[str]]
    """role -> its nodes, in node order."""
    checks_by_kind: dict[str, int]
    """check kind (the name without its node or rank) -> how many the plan runs."""


def check_kind(check: CheckSpec) -> str:
    """`weights-node1` -> `weights`, `api-golden-rank-1` -> `api-golden`: the check, wherever it runs."""
    name = check.name
    if check.node and name.endswith(f"-{check.node}"):
        name = name[:-len(check.node) - 1]
    head, _, tail = name.rpartition("-rank-")
    return head if head and tail.isdigit() else name


def memory_summary(mem: EngineMemory, node: str, utilization: float) -> MemorySummary:
    gpu = mem.gpu
    engram = "gpu" if gpu.engram else ("host" if gpu.engram_host_per_node else "none")
    return MemorySummary(node=node, gpu_gb=mem.gpu_gb, utilization=utilization, budget_gb=round(mem.budget_gb, 1),
                         weights_gb=round(gpu.weights, 1), kv_one_sequence_gb=round(gpu.kv, 1),
                         reserve_gb=gpu.reserve, per_gpu_gb=round(gpu.total, 1),
                         left_gb=round(max(0.0, mem.budget_gb - gpu.total), 1), engram=engram,
                         host_pinned_gb_per_node=round(gpu.engram_host_per_node, 1))


class RehearsalPlan(_Frozen):
    """What a stack that declares no GPUs (`rehearsal: true`, docs/rehearsal.md) runs differently from the GPU plan
    it otherwise is: `plan --json` key `rehearsal`, absent on a GPU stack."""

    engine: str
    """What serves: the image's substitute engine, not vLLM on GPUs."""
    pretended_gpus: dict[str, int]
    """node -> the GPUs its `nodes[].gpus.count` declares, which the engine pretends (ranks are planned on them)."""
    not_run: list[str]
    """Every planned check or section that prints `NOT RUN` when it runs, and why."""
    on_cpu: list[str]
    """What runs differently because there is no GPU."""
    image_needs: list[str]
    """What the engine image must hold for the steps that run in it."""


class Plan(_Frozen):
    stack: str
    image: dict[str, Any]
    model: dict[str, Any]
    topology: dict[str, Any]
    start_order: list[str]
    nodes: list[NodePlan]
    checks: list[CheckSpec]
    listeners: list[Listener]
    firewall: FirewallPlan
    proxy: ProxyPlan | None
    observability: ObservabilityPlan | None = None
    """Monitoring containers and generated files (`observability.enabled`); None when off."""
    endpoint: str
    warnings: list[str]
    notes: list[str]
    summary: PlanSummary
    memory: list[dict[str, Any]] = []
    """One entry per node: what one of its GPUs holds (stacks/planner/load_estimate.py `memory_table`)."""
    rehearsal: RehearsalPlan | None = None
    """A stack that declares no GPUs: what runs differently; None (and no `rehearsal` key in the JSON) otherwise."""
    group: str | None = None
    """The replica group this plan is of (stacks/planner/groups.py); None (no `group` key) for a stack without."""

    def node(self, name: str) -> NodePlan:
        return next(n for n in self.nodes if n.name == name)

    @property
    def head(self) -> NodePlan:
        return self.nodes[0]

    def to_json_dict(self) -> dict[str, Any]:
        # `rehearsal` only where there is one, so a GPU stack's plan stays as it was
        exclude = {k for k in ("rehearsal", "group") if getattr(self, k) is None}
        return self.model_dump(mode="json", exclude=exclude or None)


def build_plan(stack: str, config: StackConfig, group: GroupContext | None = None) -> Plan:
    """Validate and derive the whole plan; raises ConfigError with every problem at once. `group`: this config is
    one replica group's (stacks/planner/groups.py `contexts`); a stack with `groups:` is planned group by group
    (stacks/planner/stack_plan.py), never whole."""
    if config.groups and group is None:
        raise ConfigError(stack, [Problem("groups", [g.name for g in config.groups],
                                          "this command plans a stack of one engine group; this stack has groups",
                                          fix=f"{STACKS} plan <stack>, {STACKS} diff and pulumi up handle groups; "
                                              "this command does not yet (docs/rolling.md)")])
    topo, profile, result = validate(config)
    if not result.ok or profile is None:
        raise ConfigError(stack, result.problems)
    tier = tier_settings(config, group)
    kv_env = {n.name: kv_node_env(config, n, tier[0]) for n in config.nodes} if tier else None
    containers = with_weights_identity(config, engine_containers(stack, config, profile, topo,
                                                                 kv_args=group.kv_args if group else (),
                                                                 kv_env=kv_env))
    table = listener_table(config, topo,
                           multinode_master_port=config.parallelism.master_port if topo.spans_nodes else None)
    if tier and group is not None:
        rows = tier_listeners(config, tier[0], tier[1], group)
        taken = [Problem(f"disaggregation.router.{'port' if r.port == tier[0].router.port else 'metrics_port'}",
                         r.port, f"{x.purpose} ({x.process}) listens on {x.ports} on {r.node}, where the router "
                         "runs", fix="another port for the router")
                 for r in rows if r.role == "router" for x in [*table, *(y for y in rows if y.role != "router")]
                 if x.node == r.node and x.port <= r.port <= (x.port_end or x.port) and not x.ephemeral]
        if taken:
            raise ConfigError(stack, taken)
        table += rows
    clashes = listener_problems(table)
    if clashes:
        raise ConfigError(stack, clashes)
    refused = rendered_argv_problems(config, {n: c.vllm_args for n, cs in containers.items() for c in cs
                                              if c.vllm_args is not None})
    if refused:
        raise ConfigError(stack, refused)
    caps = get_capabilities(config.image.ref)
    card, _ = image_card(config)
    weights = config.model.weights_gb or profile.weights_gb
    nodes = [
        NodePlan(name=n.name, host=cfg.ssh.host, role=n.role.value, gpus_present=n.gpus_present,
                 gpus_used=n.gpus_used, dp_ranks=n.dp_ranks, dp_start_rank=n.dp_start_rank,
                 containers=containers[n.name], node_rank=n.node_rank, replica=n.replica)
        for n, cfg in zip(topo.nodes, config.nodes, strict=True)
    ]
    checks = planned_checks(config, topo)
    if group is not None:  # every group is checked on its head, against its own vLLM (program.py `check-<group>`)
        own = (f"on {topo.head.name}, in its engine container, against this group's own vLLM (the front door's "
               "checks run after every group's turn)")
        checks = [c.model_copy(update={"node": topo.head.name, "runs_on": "node",
                                       "proves": c.proves.replace(f"through {endpoint(config)}", own)})
                  if c.module == "checks.api" else c for c in checks]
    roles: dict[str, list[str]] = {}
    for n in nodes:
        roles.setdefault(n.role, []).append(n.name)
    kinds: dict[str, int] = {}
    for check in checks:
        kinds[check_kind(check)] = kinds.get(check_kind(check), 0) + 1
    mem = engine_memory(config, profile, topo)
    summary = PlanSummary(memory=memory_summary(mem, config.nodes[mem.node_index].name,
                                                config.serving.gpu_memory_utilization),
                          roles=roles, checks_by_kind=kinds)
    return Plan(
        stack=stack,
        image={
            "repository": config.image.repository, "tag": config.image.tag, "digest": config.image.digest,
            "ref": config.image.ref, "pull_ref": config.image.pull_ref, "known": caps is not None,
            "vllm_version": caps.vllm_version if caps else None, "card": card.path if card else None,
        },
        model={"profile": profile.key, "served_name": config.model.served_name,
               "host_path": config.model.host_path, "container_path": config.model.container_path,
               "weights_gb": weights, "estimated_load_s": estimated_load_s(config, profile, topo),
               "outage": outage_plan(config, profile, topo,
                                     staged=any(c.module == "checks.page_cache" for c in checks),
                                     rank_gb=rank_copy_gb(config, profile, topo),
                                     argv=containers[topo.head.name][0].vllm_args)},
        topology=topology_summary(topo),
        start_order=list(topo.start_order),
        nodes=nodes,
        checks=checks,
        listeners=table,
        firewall=firewall_plan(config, table, group.tier_sources if group else ()),
        proxy=proxy_plan(config, group),
        observability=(obs := observability_plan(stack, config, topo, containers)),
        endpoint=endpoint(config),
        warnings=result.warnings + _unverified(config, topo) + exposure_warnings(config, table)
        + ephemeral_port_warnings(config, table)
        + _unpinned_monitoring(obs) + card_override_warnings(config.model.profile),
        notes=result.notes + firewall_notes(config, table, group)
        + check_notes(stack, config, topo, grouped=group is not None),
        summary=summary,
        memory=memory_table(config, profile, topo),
        rehearsal=rehearsal_plan(config, checks),
        group=group.name if group else None,
    )


def tier_settings(config: StackConfig, group: GroupContext | None) -> tuple[DisaggregationConfig, Tier] | None:
    """A prefill/decode group's KV transfer settings and tier; None for a replica group or a stack of one group."""
    if group is None or group.role not in ("prefill", "decode") or group.disaggregation is None:
        return None
    return group.disaggregation, "prefill" if group.role == "prefill" else "decode"


def tier_listeners(config: StackConfig, settings: DisaggregationConfig, tier: Tier, group: GroupContext
                   ) -> list[Listener]:
    """The tier's NIXL handshake ports (its cluster and the other tier may connect) and, on the first group's head,
    the router's two loopback ports."""
    sources = collapse([*internal_sources(config), *group.tier_sources]) if config.firewall.enabled else []
    rows = side_channel_listeners(config, settings, tier, sources or internal_sources(config))
    if group.router is not None:
        head = config.head.name
        router = settings.router
        for port, purpose in ((router.port, "vllm-router (prefill/decode): the front door's upstream"),
                              (router.metrics_port, "vllm-router's Prometheus metrics (the prefill/decode check)")):
            rows.append(Listener(node=head, port=port, bind="127.0.0.1", network="loopback", purpose=purpose,
                                 public=False, role="router", process="vllm-router", reach="local", internal=True,
                                 ephemeral=False, allowed_sources=[],
                                 source=SRC_ROUTER))
    return rows


def weights_identity(config: StackConfig) -> str | None:
    """16 hex digits naming the checkpoint `model.source` selects, or None for a node's own directory."""
    source = config.model.source
    if source is None:
        return None
    payload = json.dumps(source.identity(), sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def with_weights_identity(config: StackConfig, containers: dict[str, list[ContainerSpec]]
                          ) -> dict[str, list[ContainerSpec]]:
    """With a `model.source`, every engine carries its identity and the group generation includes it: a sync of
    another checkpoint into the same directory would otherwise leave the old weights serving from GPU memory
    until some rank restarts and loads the new ones. Without a source nothing changes (no replacement when
    this code rolls out)."""
    identity = weights_identity(config)
    if identity is None:
        return containers
    key = GENERATION_LABEL
    out: dict[str, list[ContainerSpec]] = {}
    for node, specs in containers.items():
        out[node] = []
        for spec in specs:
            labels = dict(spec.labels)
            if key in labels:
                labels[key] = hashlib.sha256(f"{labels[key]}:{identity}".encode()).hexdigest()[:16]
            labels[WEIGHTS_LABEL] = identity
            out[node].append(spec.model_copy(update={"labels": labels}))
    return out


def _exposure_warning(listener: Listener) -> str:
    if listener.network == "all":
        return (f"{listener.purpose} listens on every address of {listener.node} (port {listener.port}; it takes "
                "no bind address): only a host firewall keeps it private; allow it from the other nodes' "
                "control-plane IPs only")
    return (f"{listener.purpose} listens on {listener.bind}:{listener.port} ({listener.node}), which is neither "
            "loopback nor in fabric.private_networks: declare that network private if it is, or move the control "
            "plane")


def endpoint(config: StackConfig) -> str:
    """What clients and the API checks call: the proxy when it is on, else vLLM's own port."""
    proxy = config.api.proxy
    if proxy.enabled:
        host = config.api.public_host or proxy.server_name or config.head.management_ip
        return f"{'https' if proxy.tls else 'http'}://{bracket_host(host)}:{proxy.port}"
    host = config.serving.host
    if api_on_head(config):
        return f"http://{bracket_host(host)}:{config.serving.port}"
    default = host if host not in ("0.0.0.0", "::") else config.head.management_ip
    return f"http://{bracket_host(config.api.public_host or default)}:{config.serving.port}"


def api_on_head(config: StackConfig) -> bool:
    """vLLM on loopback without the proxy: nobody off the head can reach it, so the API checks run on the head
    (in the engine container, over SSH) instead of waiting on the deployer for a port it cannot reach."""
    return not config.api.proxy.enabled and config.serving.host in ("127.0.0.1", "::1")


def check_client(config: StackConfig) -> str | None:
    """Whose proxy key the API checks send: api.proxy.check_client, else the first client."""
    if not config.api.proxy.enabled or not config.proxy_keys:
        return None
    return config.api.proxy.check_client or next(iter(config.proxy_keys))


def proxy_plan(config: StackConfig, group: GroupContext | None = None) -> ProxyPlan | None:
    proxy = config.api.proxy
    if not proxy.enabled:
        return None
    door = front_door(config, group)
    return ProxyPlan(
        node=config.head.name, container=proxy.container_name, image=proxy.image.pull_ref,
        listen=f"{bracket_host(proxy.bind)}:{proxy.port}", tls=proxy.tls, server_name=proxy.server_name,
        upstream=door.upstream,
        clients=sorted(config.proxy_keys or {}), check_client=check_client(config) or "",
        allowed_paths=list(door.routes.allowed), open_paths=list(door.routes.open),
        denied_paths=list(door.routes.denied), denied_from=door.routes.source,
        limits=proxy.limits.model_dump(), max_body_mb=proxy.max_body_mb, read_timeout_s=proxy.read_timeout_s)


def _unpinned_monitoring(obs: ObservabilityPlan | None) -> list[str]:
    if obs is None or not obs.unpinned_images:
        return []
    return [f"{', '.join(obs.unpinned_images)} not pinned by digest: a re-pushed tag changes what runs; write each "
            "as repo:tag@sha256:<digest> (docker buildx imagetools inspect repo:tag prints it)"]


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
        "replica_nodes": topo.replica_nodes,
        # only where it is not the default, so the plans of internal stacks stay as they were
        **({"load_balancing": topo.load_balancing} if topo.load_balancing != "internal" else {}),
    }


def planned_checks(config: StackConfig, topo: Topology) -> list[CheckSpec]:
    checks: list[CheckSpec] = []
    for node_topo in topo.nodes:
        runs_vllm = node_topo.role is not Role.RAY_WORKER
        checks.append(CheckSpec(
            name=f"args-dry-run-{node_topo.name}", node=node_topo.name, runs_on="node", module="checks.vllm_args",
            sections=[], proves=("the new image's own vLLM parses the argv of each of this node's DP rank servers "
                                 f"({', '.join(map(str, node_topo.dp_ranks))}; no GPU), before any engine is replaced"
                                 if topo.external else "the new image's own vLLM parses this node's argv (no GPU), "
                                 "before any engine is replaced") if runs_vllm else
            "the new image starts on this node and imports vllm and ray"))
    checks += [CheckSpec(name=f"page-cache-{n.name}", node=n.name, runs_on="node", module="checks.page_cache",
                         sections=[], proves="the shards this node's ranks will read are in the page cache (as much "
                         "as MemAvailable less the running engine's pinned memory holds; the rest is named), before "
                         "any engine is replaced") for n in topo.nodes]
    checks += node_checks(config)
    if topo.backend == "ray":
        checks.append(CheckSpec(name="ray-cluster", node=topo.head.name, runs_on="node", module="checks.ray_cluster",
                                sections=[], proves=f"Ray sees {len(topo.nodes)} nodes and {topo.gpus_used} GPUs"))
    checks += api_checks(config, topo)
    if topo.spans_nodes:
        checks += [
            CheckSpec(name=f"engines-{n.name}", node=n.name, runs_on="node", module="checks.engines",
                      sections=["workers"], proves=_spanning_proves(topo, n))
            for n in topo.nodes
        ]
    elif topo.backend == "mp" and topo.data > 1:
        checks += [
            CheckSpec(name=f"dp-engines-{n.name}", node=n.name, runs_on="node", module="checks.engines",
                      sections=[], proves=f"DP rank(s) {n.dp_ranks} loaded and joined (of {topo.data})"
                      + (" (each rank's own container log)" if topo.external else ""))
            for n in topo.nodes
        ]
    for name in nccl_evidence_nodes(config, topo):
        checks.append(CheckSpec(name=f"nccl-transport-{name}", node=name, runs_on="node",
                                module="checks.nccl_transport", sections=[],
                                proves="NCCL uses IB/RoCE with GPU Direct RDMA, not a socket fallback"))
    if config.rehearsal:
        checks = [_rehearsal_proves(c) for c in checks]
    return checks


WHOLE_CHECK = "the whole check"


def rehearsal_not_run(check: CheckSpec) -> list[str]:
    """The parts of a planned check that a rehearsal (no GPUs) prints as NOT RUN when the check runs: GPU and RDMA
    sections of the preflights (checks.preflight `REHEARSAL_NOT_RUN`) and of the DeepEP host check, nvidia-smi's
    GPU processes in ownership, NCCL in the collective check (gloo on CPU runs), and the whole NCCL transport and
    engine-log checks."""
    if check.module == "checks.preflight":
        parts = [s for s in check.sections if s in PREFLIGHT_NOT_RUN]
        return [*parts, *(["ownership's GPU processes (nvidia-smi)"] if "ownership" in check.sections else [])]
    if check.module == "checks.deepep_host":
        return [s for s in check.sections if s in DEEPEP_NOT_RUN]
    if check.module in ("checks.nccl_transport", "checks.engines"):
        return [WHOLE_CHECK]
    if check.module == "checks.collective":
        return ["NCCL on GPUs (gloo on CPU runs instead)"]
    return []


def _rehearsal_proves(check: CheckSpec) -> CheckSpec:
    parts = rehearsal_not_run(check)
    if not parts or check.module == "checks.collective":  # the collective's proves says gloo already
        return check
    if parts == [WHOLE_CHECK]:
        proves = f"rehearsal: prints NOT RUN and why, reads nothing (on GPU nodes: {check.proves})"
    else:
        proves = f"{check.proves} (rehearsal: NOT RUN {', '.join(parts)})"
    return check.model_copy(update={"proves": proves})


def rehearsal_plan(config: StackConfig, checks: list[CheckSpec]) -> RehearsalPlan | None:
    """What runs differently on a stack that declares no GPUs (docs/rehearsal.md); None on a GPU stack."""
    if not config.rehearsal:
        return None
    by_kind: dict[str, tuple[int, list[str]]] = {}
    for check in checks:
        parts = rehearsal_not_run(check)
        if parts:
            count, _ = by_kind.get(check_kind(check), (0, parts))
            by_kind[check_kind(check)] = (count + 1, parts)
    not_run = [f"{kind}{f' x{count}' if count > 1 else ''}: NOT RUN {', '.join(parts)}"
               for kind, (count, parts) in by_kind.items()]
    gpus = {n.name: n.gpus.count for n in config.nodes}
    on_cpu = [f"engine containers: no GPU (no --gpus, no device request) and no CUDA_VISIBLE_DEVICES; the engine "
              f"pretends the {sum(gpus.values())} GPU(s) of nodes[].gpus"]
    if any(c.module == "checks.collective" for c in checks):
        floor, origin = min_busbw_gbps(config)
        on_cpu.append(f"collective-<node>: torch's gloo on CPU, one process per node, floor {floor:g} Gb/s ({origin})")
    on_cpu.append("args-dry-run-<node>: as on GPU nodes (it never uses a GPU): the image's own `vllm` CLI parses "
                  "each node's argv")
    return RehearsalPlan(
        engine=f"{config.image.ref} must be a substitute engine that serves vLLM's OpenAI API without a GPU: no vLLM "
               "runs on GPUs, so the api-* checks prove the deployment (ports, firewall, keys, DP rank routing) and "
               "the substitute engine's answers, not the model",
        pretended_gpus=gpus, not_run=not_run, on_cpu=on_cpu, image_needs=list(IMAGE_NEEDS))


def node_checks(config: StackConfig) -> list[CheckSpec]:
    """Per node, in the order `pulumi up` runs them: the weights (sync or verify), the DeepEP host check (with a
    DeepEP all-to-all backend over nodes) and the host preflight before the image pull, the one after it, the fabric
    preflight; then the cross-node weights comparison and, with more than one node, the collective check."""
    before, after = node_preflight_sections(config)
    source = config.model.source
    needs = deepep.deepep_host_requirements(deepep.configured_backend(config), spans_nodes=len(config.nodes) > 1)
    checks: list[CheckSpec] = []
    for node in config.nodes:
        weights = CheckSpec(
            name=f"weights-{node.name}", node=node.name, runs_on="node", module="checks.weights",
            sections=["sync" if source else "verify"],
            proves=(f"{config.model.host_path} holds {source.url} (fetched in the stack's image, resumable; "
                    "the manifest hash is the stack output `weights`)" if source else
                    f"{config.model.host_path} is complete: config.json, tokenizer, every indexed shard at its "
                    "header's length (its listing hash is the stack output `weights`)"))
        pre = CheckSpec(name=f"pre-pull-{node.name}", node=node.name, runs_on="node", module="checks.preflight",
                        sections=before, proves=_preflight_proves(before) + " (before the image pull)")
        post = CheckSpec(name=f"preflight-{node.name}", node=node.name, runs_on="node", module="checks.preflight",
                         sections=after, proves=_preflight_proves(after) + " (after the image pull)")
        host = [] if needs is None else [deepep_host_check(config, node, needs)]
        checks += [*host, pre, weights, post] if source else [weights, *host, pre, post]
        if config.fabric.transport != "socket":
            fabric = fabric_sections(node)
            checks.append(CheckSpec(name=f"fabric-{node.name}", node=node.name, runs_on="node",
                                    module="checks.preflight", sections=fabric,
                                    proves=", ".join(_FABRIC_PROVES[s] for s in fabric)))
    if len(config.nodes) > 1:
        checks.append(CheckSpec(
            name="weights-match", node=None, runs_on="deployer", module="checks.weights_match", sections=[],
            proves="every node's weights-<node> reported the same hash (names the node that differs); no engine "
                   "moves before"))
        checks += collective_checks(config)
    return checks


def deepep_host_check(config: StackConfig, node: NodeConfig, needs: deepep.DeepEPHostRequirements) -> CheckSpec:
    """`deepep-host-<node>`: the driver options or GDRCopy for IBGDA, GPU memory registration, and every data NIC
    reaching every peer's, before the image pull (docs/deepep-hosts.md)."""
    sections = deepep.host_sections(config, node, needs)
    proves = {"ibgda": "IBGDA possible (the NVIDIA driver's PeerMappingOverride/EnableStreamMemOPs, or gdrdrv)",
              "peermem": "GPU memory registrable with the NIC (dma-buf or nvidia_peermem)",
              "reach": "every data NIC reaches every other node's data NICs"}
    return CheckSpec(name=f"deepep-host-{node.name}", node=node.name, runs_on="node", module="checks.deepep_host",
                     sections=sections, proves=f"{needs.backend}: " + "; ".join(proves[s] for s in sections)
                     + " (before the image pull)")


_PREFLIGHT_PROVES = {
    "ownership": "nothing this stack does not own holds the engine's name, ports or GPUs",
    "disk": "room on Docker's storage for the pull", "gpu": "GPU count, model and memory",
    "model": "config.json, shards and per-GPU memory from the real headers",
    "toolkit": "a container sees every GPU", "memlock": "memlock unlimited in a container",
}


_FABRIC_PROVES = {"infiniband": "/dev/infiniband", "hca": "HCA ports active", "gid": "RoCE v2 GID",
                  "sysctl": "multi-NIC sysctls"}


def fabric_sections(node: NodeConfig) -> list[str]:
    """The fabric preflight's sections that have something to check on this node: hca needs nodes[].hcas, gid
    also nodes[].gid_index, sysctl nodes[].nics (a section given nothing would pass without looking)."""
    wanted = {"infiniband": True, "hca": bool(node.hcas), "gid": bool(node.hcas) and node.gid_index is not None,
              "sysctl": bool(node.nics)}
    return [s for s in FABRIC_PREFLIGHT if wanted[s]]


def _preflight_proves(sections: list[str]) -> str:
    return "; ".join(_PREFLIGHT_PROVES[s] for s in sections)


def min_busbw_gbps(config: StackConfig) -> tuple[float, str]:
    """The collective check's floor and where it comes from."""
    if config.fabric.min_busbw_gbps is not None:
        return config.fabric.min_busbw_gbps, "fabric.min_busbw_gbps"
    if config.rehearsal:
        return MIN_BUSBW_GBPS, "the rehearsal's default: gloo between CPUs measures no fabric"
    return DEFAULT_MIN_BUSBW_GBPS[config.fabric.transport], f"the default for {config.fabric.transport}"


def collective_checks(config: StackConfig) -> list[CheckSpec]:
    """One all-reduce process per node, all at once, before the engines start (docs/checks-by-hand.md:
    Collective check)."""
    floor, origin = min_busbw_gbps(config)
    transport = config.fabric.transport
    how = "NCCL over sockets" if transport == "socket" else f"NCCL over {transport} with GPU Direct RDMA"
    if config.rehearsal:
        how = ("gloo on CPU, one process per node, over each node's GLOO_SOCKET_IFNAME (a rehearsal: NCCL on GPUs "
               "is NOT RUN)")
    return [CheckSpec(
        name=f"collective-{node.name}", node=node.name, runs_on="node", module="checks.collective", sections=[],
        proves=f"an all-reduce over all {len(config.nodes)} nodes reaches {floor:g} Gb/s bus bandwidth ({origin}), "
               f"sums right and uses {how}; on first deploy and on an image or fabric change, after every dry run "
               "and before the engines start (it stops this stack's engine on the node first)")
        for node in config.nodes]


def api_checks(config: StackConfig, topo: Topology) -> list[CheckSpec]:
    """The post-deploy API checks, through `endpoint` (the proxy when it is on; on the head itself when vLLM
    binds loopback without the proxy). The golden set, thinking and streaming run once per DP rank
    (`X-data-parallel-rank`), so the plan lists them per rank."""
    on_head = api_on_head(config)
    node, runs_on = (topo.head.name, "node") if on_head else (None, "deployer")
    ranked = [c for c in RANKED_API_CHECKS if _api_check_applies(config, c)]
    dp_size, rank_nodes = endpoint_rank_nodes([(n.name, n.dp_ranks, n.role.value) for n in topo.nodes],
                                              topo.load_balancing)
    golden = config.api.smoke.golden
    pairs = f"{len(golden)} golden pair(s) ({_short(golden[0].prompt)} -> /{golden[0].expect}/"
    pairs += ", …)" if len(golden) > 1 else ")"
    # the whole set by its hash, so a review sees any pair change, not only the first one's visible part
    digest = hashlib.sha256(json.dumps([[g.prompt, g.expect] for g in golden], ensure_ascii=False).encode())
    pairs += f" [golden set {digest.hexdigest()[:12]}]"
    extra = "".join(f"; {_RANKED_PROVES[c]}" for c in ranked if c != "chat")
    checks = [CheckSpec(name=f"api-{c}", node=node, runs_on=runs_on, module="checks.api", sections=[c],
                        proves=_API_PROVES[c]) for c in ("health", "models")]
    if topo.hybrid:
        checks.append(CheckSpec(name="api-golden", node=node, runs_on=runs_on, module="checks.api",
                                sections=ranked, proves=f"whichever node's API server answers {pairs} at temperature "
                                f"0 with thinking off{extra}; through {endpoint(config)}, which "
                                + ("spreads requests over every node's API server" if config.api.proxy.enabled else
                                   "is the head's API server (its own ranks only)")))
        checks += [CheckSpec(
            name=f"api-node-{n.name}", node=n.name, runs_on="node", module="checks.api",
            sections=["health", "models", *ranked],
            proves=f"{n.name}'s own API server is up and each of its DP ranks {n.dp_ranks[0]}-{n.dp_ranks[-1]} "
                   f"(X-data-parallel-rank 0-{len(n.dp_ranks) - 1}: a node-local index with hybrid load balancing) "
                   f"answers {pairs} at temperature 0 with thinking off{extra}; on the node, in its engine container")
            for n in topo.nodes]
    elif topo.external:
        checks.append(CheckSpec(name="api-golden", node=node, runs_on=runs_on, module="checks.api",
                                sections=ranked, proves=f"whichever DP rank's server answers {pairs} at temperature 0 "
                                f"with thinking off{extra}; through {endpoint(config)}, which "
                                + ("spreads requests over every rank's server" if config.api.proxy.enabled else
                                   "is DP rank 0's own server (its engine only)")))
        checks += [CheckSpec(
            name=f"api-server-rank-{r}", node=n.name, runs_on="node", module="checks.api",
            sections=["health", "models", *ranked],
            proves=f"DP rank {r}'s own server on {n.name} (port {rank_port(config, n, r)}) is up and answers {pairs} "
                   f"at temperature 0 with thinking off{extra} from its one engine (no rank header: it has no other); "
                   "on the node, in that rank's container")
            for n in topo.nodes for r in n.dp_ranks]
    elif dp_size == 1:
        checks.append(CheckSpec(name="api-golden", node=node, runs_on=runs_on, module="checks.api",
                                sections=ranked, proves=f"the engine answers {pairs} at temperature 0 with "
                                f"thinking off{extra}; through {endpoint(config)}"))
    else:
        checks += [CheckSpec(name=f"api-golden-rank-{r}", node=node, runs_on=runs_on, module="checks.api",
                             sections=ranked, proves=f"DP rank {r} on {rank_nodes[r]} (X-data-parallel-rank: {r}) "
                             f"answers {pairs} at temperature 0 with thinking off{extra}; through {endpoint(config)}")
                   for r in range(dp_size)]
    checks += [CheckSpec(name=f"api-{c}", node=node, runs_on=runs_on, module="checks.api", sections=[c],
                         proves=_API_PROVES[c]) for c in ("auth", "deny") if _api_check_applies(config, c)]
    return checks


_RANKED_PROVES = {"thinking": "thinking on returns reasoning and the first pair's answer",
                  "stream": "streaming yields the first pair's answer and [DONE]"}


def _short(prompt: str) -> str:
    return repr(prompt if len(prompt) <= 24 else prompt[:20] + "…")


def api_sections(plan: Plan) -> list[str]:
    """Every `checks.api` section the plan lists, once each, in API_CHECKS order."""
    listed = {s for c in plan.checks if c.module == "checks.api" for s in c.sections}
    return [s for s in API_CHECKS if s in listed]


def check_notes(stack: str, config: StackConfig, topo: Topology, *, grouped: bool = False) -> list[str]:
    """How to run the watch unit, and what the weights and collective checks need from the deployer. `grouped`: a
    replica group's plan, which the watch unit refuses (docs/rolling.md)."""
    kwarg, why = thinking_kwarg(config)
    thinking = [] if kwarg is not None or not config.api.smoke.thinking_check else [
        f"no thinking check: {why}, so no answer carries reasoning (serve one with serving.reasoning_parser, or "
        "set api.smoke.thinking_check: false to say so)"]
    watch = ("watch mode does not handle replica groups yet: the watch unit refuses a stack with groups "
             "(docs/rolling.md)" if grouped else
             f"watch every DP rank after the deploy: {STACKS_VENV} watch-unit {stack} > "
             f"vllm-cluster-watch-{stack}.service (a systemd service for the deploying host; "
             "docs/checks-by-hand.md: Watch mode)")
    notes = [*thinking, watch]
    source = config.model.source
    if source is not None and config.s3_access_key_id is None:
        notes.append(f"model.source {source.url}: no s3_access_key_id/s3_secret_access_key secrets, so each node's "
                     "sync uses the credentials boto3 finds itself there (an instance role through the metadata "
                     "service, reachable from the container on the host network); a node without any fails with "
                     "exit 2 naming the bucket")
    if len(config.nodes) > 1:
        notes.append(f"collective check: the {len(config.nodes)} collective-<node> commands must run at the same "
                     f"time: pulumi up --parallel must be at least {len(config.nodes)} (Pulumi's default is 4 x the "
                     "deploying machine's CPUs; PULUMI_PARALLEL sets it too)")
    return notes


def _spanning_proves(topo: Topology, node: NodeTopology) -> str:
    """Engine evidence per node where a replica spans nodes: every node's own workers, plus the engine core
    where one runs (the first node of each replica)."""
    workers = f"its {node.gpus_used} worker(s) of replica {node.replica} loaded their weights"
    if node.dp_ranks:
        return f"the engine core of DP rank {node.dp_ranks[0]} reported its KV cache and {workers}"
    return f"{workers} (workers only: no engine core runs here)"


def thinking_kwarg(config: StackConfig) -> tuple[str | None, str]:
    """The request key of the thinking check (stacks/planner/model_cards.py `thinking_request`); None when the stack
    serves no reasoning parser (or its card cannot be read: the plan names that)."""
    try:
        profile = get_profile(config.model.profile)
    except CardProblem as exc:
        return None, str(exc)
    if profile is None:
        return None, f"no card {config.model.profile}"
    return thinking_request(profile, config.serving.reasoning_parser)


def thinking_args(config: StackConfig, sections: list[str]) -> list[str]:
    """`--thinking-kwarg` for the chat, thinking and stream sections when the card's key is not the check's
    default (`thinking`, DeepSeek's): Qwen3 reads `enable_thinking`, gpt-oss a reasoning effort."""
    kwarg = thinking_kwarg(config)[0]
    if kwarg is None or kwarg == "thinking" or not set(sections) & {"chat", "thinking", "stream"}:
        return []
    return ["--thinking-kwarg", kwarg]


def _api_check_applies(config: StackConfig, check: str) -> bool:
    smoke = config.api.smoke
    return {
        "thinking": smoke.thinking_check and thinking_kwarg(config)[0] is not None,
        "stream": smoke.stream_check,
        "auth": config.api_key is not None or config.api.proxy.enabled,
        "deny": config.api.proxy.enabled,
    }.get(check, True)


def nccl_evidence_nodes(config: StackConfig, topo: Topology) -> list[str]:
    """Whose container log holds NCCL's network lines: every node with mp; the head with Ray, whose driver
    receives the Ray workers' output. None where no evidence can exist (one node, sockets, NCCL_DEBUG off)."""
    if len(topo.nodes) < 2 or config.fabric.transport == "socket" or config.fabric.nccl_debug != "INFO":
        return []
    return [topo.head.name] if topo.backend == "ray" else [n.name for n in topo.nodes]


_API_PROVES = {
    "health": "/health answers 200 (the engine finished loading)",
    "models": "/v1/models lists the served name",
    "auth": "no key and a wrong key both get 401",
    "deny": "paths outside the allowlist (the image's other vLLM paths, an unknown one) get 403/404 from the "
            "proxy, for GET, POST, PUT, PATCH and DELETE",
}


def card_override_warnings(profile: object) -> list[str]:
    """The project's cards that hide shipped ones (the model card of `profile`, every image card): warned on every
    plan, a refused one too (the CLI prints them beside the refusal), since a card of the user's replaced what
    was reviewed upstream."""
    return _shadowing_card(profile) + _shadowing_image_cards()


def _shadowing_card(profile: object) -> list[str]:
    """A project card that hides a shipped card of the same name: both files named, every plan."""
    both = shadowed_card(profile) if isinstance(profile, str) else None
    if both is None:
        return []
    return [f"model.profile {profile!r}: {both[0]} is used, and it hides the shipped card {both[1]} "
            f"of the same name; rename yours ({STACKS} model-card SRC --name <another name>) or delete it "
            "to use the shipped one"]


def _shadowing_image_cards() -> list[str]:
    """Project image cards that replace shipped cards of the same name: both files named, every plan."""
    return [f"image card {mine} is used, and it hides the shipped card {theirs} of the same name (taken with "
            "image-card --override-shipped); delete it to use the shipped one" for mine, theirs in shadowed_cards()]


def exposure_warnings(config: StackConfig, table: list[Listener]) -> list[str]:
    """With the firewall off, the internal listeners anyone can reach, in one line (with it on there are none:
    their allowed sources are the cluster and the private networks by construction)."""
    exposed = [x for x in table if x.internal and x.public]
    if not exposed:
        return []
    ports = sorted({f"{x.node}:{x.ports}" for x in exposed})
    kinds = sorted({x.purpose.split(" (")[0] for x in exposed})
    return [f"firewall.enabled is false: {len(exposed)} internal listener(s) ({', '.join(kinds[:4])}"
            f"{', ...' if len(kinds) > 4 else ''}; unauthenticated) accept connections from any address that can "
            f"route to the nodes ({', '.join(ports[:6])}{', ...' if len(ports) > 6 else ''}); keep the firewall on, "
            "or filter these ports yourself"]


def firewall_notes(config: StackConfig, table: list[Listener], group: GroupContext | None = None) -> list[str]:
    """Who the firewall lets reach the API port, because the deployer's own checks must be among them. A later
    replica group behind the front door: only the front door's host (stacks/planner/groups.py `group_config`)."""
    if not config.firewall.enabled:
        return []
    api = [x for x in table if x.reach == "clients"]
    if not api or "0.0.0.0/0" in api[0].allowed_sources:
        return []
    nodes = ", ".join(dict.fromkeys(x.node for x in api))  # hybrid load balancing: every node's API port
    if group is not None and group.front_door is not None:
        return [f"firewall: {nodes}:{', '.join(sorted({x.ports for x in api}))} accepts only "
                f"{', '.join(api[0].allowed_sources)}, the front door on {group.front_door}: clients go through "
                "it (vLLM's key guards only /v1 paths); this group's own check runs on its head"]
    return [f"firewall: {nodes}:{', '.join(sorted({x.ports for x in api}))} accepts only "
            f"{', '.join(api[0].allowed_sources)}; clients, load balancers and the deployer (api-* checks) "
            "elsewhere need firewall.api_sources"]


def roles(plan: Plan) -> dict[str, str]:
    return {n.name: n.role for n in plan.nodes}

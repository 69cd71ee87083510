"""Node roles, DP ranks, EP size and start order, derived from the config for any number of nodes.

The first node is the head. With `mp` (vLLM internal DP) every node runs `data_parallel_local` DP ranks
of TP x PP GPUs each; every node but the head is `--headless` with a start rank equal to the sum of the
local DP sizes before it. With `ray` one replica of TP x PP spans all nodes; the head runs `vllm serve`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from stacks.config import StackConfig
from stacks.errors import Problem


class Role(StrEnum):
    DP_HEAD = "dp-head"
    HEADLESS_ENGINE = "headless-engine"
    RAY_HEAD = "ray-head"
    RAY_WORKER = "ray-worker"

    @property
    def is_head(self) -> bool:
        return self in (Role.DP_HEAD, Role.RAY_HEAD)


@dataclass(frozen=True)
class NodeTopology:
    name: str
    index: int
    role: Role
    gpus_present: int
    gpus_used: int
    dp_local: int | None
    dp_start_rank: int | None

    @property
    def dp_ranks(self) -> list[int]:
        if self.dp_local is None:
            return []
        start = self.dp_start_rank or 0
        return list(range(start, start + self.dp_local))


@dataclass(frozen=True)
class Topology:
    backend: str
    tensor: int
    pipeline: int
    data: int
    expert_size: int | None
    nodes: tuple[NodeTopology, ...]
    start_order: tuple[str, ...]

    @property
    def head(self) -> NodeTopology:
        return self.nodes[0]

    @property
    def gpus_used(self) -> int:
        return sum(n.gpus_used for n in self.nodes)

    @property
    def gpus_present(self) -> int:
        return sum(n.gpus_present for n in self.nodes)

    @property
    def label(self) -> str:
        """Compact form for labels and tables: `mp-dp2-tp8-pp1-ep16`."""
        ep = f"-ep{self.expert_size}" if self.expert_size else ""
        return f"{self.backend}-dp{self.data}-tp{self.tensor}-pp{self.pipeline}{ep}"


def derive_topology(config: StackConfig) -> tuple[Topology, list[Problem]]:
    """Derive the topology; problems are returned (not raised) so validation can report them all."""
    par = config.parallelism
    if par.backend == "ray":
        nodes, problems = _ray_nodes(config)
    else:
        nodes, problems = _mp_nodes(config)
    non_head = tuple(n.name for n in nodes[1:])
    order = (nodes[0].name, *non_head) if par.backend == "ray" else (*non_head, nodes[0].name)
    expert = par.tensor * par.data if par.expert else None
    topology = Topology(par.backend, par.tensor, par.pipeline, par.data, expert, tuple(nodes), order)
    return topology, problems


def _ray_nodes(config: StackConfig) -> tuple[list[NodeTopology], list[Problem]]:
    nodes = [
        NodeTopology(node.name, i, Role.RAY_HEAD if i == 0 else Role.RAY_WORKER, node.gpus.count,
                     node.gpus.count, None, None)
        for i, node in enumerate(config.nodes)
    ]
    return nodes, []


def _mp_nodes(config: StackConfig) -> tuple[list[NodeTopology], list[Problem]]:
    par = config.parallelism
    per_rank = par.tensor * par.pipeline
    problems: list[Problem] = []
    remaining = par.data
    locals_: list[int] = []
    for i, node in enumerate(config.nodes):
        capacity = node.gpus.count // per_rank
        if node.data_parallel_local is not None:
            local = node.data_parallel_local
            if local * per_rank > node.gpus.count:
                problems.append(Problem(
                    f"nodes.{i}.data_parallel_local", local,
                    f"{local} DP ranks x TP{par.tensor} x PP{par.pipeline} = {local * per_rank} GPUs, "
                    f"node {node.name} has {node.gpus.count}",
                    fix=f"at most {capacity} on this node"))
        else:
            local = max(0, min(capacity, remaining))
        locals_.append(local)
        remaining -= local
    assigned = sum(locals_)
    capacity_total = sum(n.gpus.count // per_rank for n in config.nodes)
    # capacity 0 means TP x PP exceeds every node: the TP rule in validation says so; no second error here.
    if assigned != par.data and capacity_total > 0:
        problems.append(Problem(
            "parallelism.data", par.data,
            f"DP ranks do not map onto the nodes: {assigned} rank(s) fit "
            f"(TP{par.tensor} x PP{par.pipeline} = {per_rank} GPUs per rank, local DP {locals_})",
            fix=f"parallelism.data = {capacity_total} for these nodes, or add nodes / set data_parallel_local"))
    for i, (node, local) in enumerate(zip(config.nodes, locals_, strict=True)):
        if local == 0 and assigned == par.data:
            problems.append(Problem(
                f"nodes.{i}.name", node.name, "this node gets no DP rank and would sit idle",
                fix=f"remove it, or raise parallelism.data to {par.data + node.gpus.count // per_rank}"))
    nodes = []
    start = 0
    for i, (node, local) in enumerate(zip(config.nodes, locals_, strict=True)):
        role = Role.DP_HEAD if i == 0 else Role.HEADLESS_ENGINE
        nodes.append(NodeTopology(node.name, i, role, node.gpus.count, local * per_rank, local,
                                  None if i == 0 else start))
        start += local
    return nodes, problems

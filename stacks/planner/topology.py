"""Node roles, DP ranks, EP size and start order, derived from the config for any number of nodes.

The first node is the head. With `ray` one replica of TP x PP spans all nodes; the head runs `vllm serve`.
With `mp` there are two shapes:

- a replica fits one node (vLLM internal DP): every node runs `data_parallel_local` DP ranks of TP x PP GPUs
  each; every node but the head is `--headless` with a start rank equal to the sum of the local DP sizes
  before it. With `parallelism.dp_load_balancing: hybrid` those nodes run their own API server over their own
  ranks instead (role `dp-api-engine`), and the head names start rank 0. With `external` every DP rank is a
  vLLM server of its own (`--data-parallel-rank r`, `--data-parallel-size-local 1`): one container per rank on
  the GPUs of that rank, its API on `serving.port` + the rank's index on its node (role `dp-rank-servers` after
  the head); rank 0 on the head still hosts the DP RPC handshake and coordinator every engine joins.
- a replica spans nodes (vLLM 0.33.0's own multi-node executor, no Ray): every node runs `vllm serve` with
  `--nnodes N --node-rank r --master-addr <head> --master-port P`, ranks > 0 `--headless`. Each of the DP
  replicas takes N / DP consecutive nodes (`ParallelConfig.nnodes_within_dp`, vllm/config/parallel.py:811-836);
  a node's share of its replica is TP x PP x DP / N GPUs (engine/arg_utils.py:2399-2424). Node r serves DP
  rank r // (N / DP) (the rank vLLM infers from `--node-rank`, engine/arg_utils.py:2421-2424, 2506-2511).
  The first node of a replica (`node_rank_within_dp == 0`) runs that replica's engine core and executor
  leader; the others run workers only (entrypoints/cli/serve.py:218-233).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from stacks.model.config import StackConfig
from stacks.model.errors import Problem

DP_MASTER_PORT = 29500
"""vLLM's `ParallelConfig.data_parallel_master_port` default (0.33.0, vllm/config/parallel.py:165)."""


class Role(StrEnum):
    DP_HEAD = "dp-head"
    HEADLESS_ENGINE = "headless-engine"
    RAY_HEAD = "ray-head"
    RAY_WORKER = "ray-worker"
    MP_HEAD = "mp-head"
    """Node rank 0 of replicas that span nodes: API server, DP coordinator (DP > 1), the engine core of DP
    rank 0, its executor leader and workers; global rank 0's TCPStore on `--master-port`."""
    MP_REPLICA_HEAD = "mp-replica-head"
    """First node of replica r > 0 (`node_rank_within_dp == 0`): headless engine core of DP rank r (joins the
    head's DP RPC port), its executor leader and workers."""
    MP_WORKER = "mp-worker"
    """`node_rank_within_dp > 0`: headless, workers only; vLLM runs the executor in the serve process."""
    DP_API_ENGINE = "dp-api-engine"
    """Hybrid load balancing (`parallelism.dp_load_balancing: hybrid`), a node after the head: its own API
    server over its own DP ranks (`--data-parallel-hybrid-lb`, not `--headless`); its engines still join the
    head's DP RPC port and coordinator (vllm/v1/engine/core.py:1296-1345)."""
    DP_RANK_SERVERS = "dp-rank-servers"
    """External load balancing (`parallelism.dp_load_balancing: external`), a node after the head: one vLLM server
    per DP rank, each its own container, API port and engine (`--data-parallel-rank`); every engine still joins
    rank 0's DP RPC handshake and coordinator on the head (vllm/v1/engine/utils.py:1318-1336)."""

    @property
    def is_head(self) -> bool:
        return self in (Role.DP_HEAD, Role.RAY_HEAD, Role.MP_HEAD)

    @property
    def serves_api(self) -> bool:
        """Runs vLLM's OpenAI API server: the head, and with hybrid or external load balancing every node."""
        return self.is_head or self in (Role.DP_API_ENGINE, Role.DP_RANK_SERVERS)

    @property
    def headless(self) -> bool:
        """Runs `vllm serve --headless` (no API server)."""
        return self in (Role.HEADLESS_ENGINE, Role.MP_REPLICA_HEAD, Role.MP_WORKER)


@dataclass(frozen=True)
class NodeTopology:
    name: str
    index: int
    role: Role
    gpus_present: int
    gpus_used: int
    dp_local: int | None
    dp_start_rank: int | None
    node_rank: int | None = None
    """`--node-rank` where a replica spans nodes; None otherwise."""
    replica: int | None = None
    """The DP rank whose replica this node serves, where a replica spans nodes."""

    @property
    def dp_ranks(self) -> list[int]:
        """The DP ranks whose engine core runs on this node (none on an mp-worker)."""
        if self.dp_local is None:
            return []
        start = self.replica if self.replica is not None else self.dp_start_rank or 0
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
    replica_nodes: int = 1
    """Nodes one replica spans: vLLM's `nnodes_within_dp` (1 unless TP x PP spans nodes)."""
    load_balancing: str = "internal"
    """`parallelism.dp_load_balancing` where it applies (mp with DP > 1, replicas within a node), else internal."""

    @property
    def hybrid(self) -> bool:
        """Every node runs an API server over its own DP ranks (`--data-parallel-hybrid-lb`)."""
        return self.load_balancing == "hybrid"

    @property
    def external(self) -> bool:
        """Every DP rank is a vLLM server of its own (`--data-parallel-rank`), one container per rank."""
        return self.load_balancing == "external"

    @property
    def local_engines_only(self) -> bool:
        """Each API server reaches only its own engines, over IPC (vLLM's `ParallelConfig.local_engines_only`,
        vllm/config/parallel.py:652-657): hybrid and external load balancing."""
        return self.load_balancing in ("hybrid", "external")

    @property
    def spans_nodes(self) -> bool:
        """A replica spans nodes: vLLM's multi-node mp executor (`--nnodes`), not Ray."""
        return self.backend == "mp" and self.replica_nodes > 1

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
    replica_nodes = 1
    if par.backend == "ray":
        nodes, problems = _ray_nodes(config)
    elif replica_spans_nodes(config):
        nodes, problems = _mp_spanning_nodes(config)
        replica_nodes = max(1, len(config.nodes) // par.data)
    else:
        nodes, problems = _mp_nodes(config)
    non_head = tuple(n.name for n in nodes[1:])
    # ray: the head starts Ray first and the workers join it. mp: every headless node first, the head last:
    # the headless side only dials out and retries (ZMQ handshake to the DP RPC port; TCPStore clients to
    # --master-port), while the head hosts what they dial and starts the clocks that wait for them.
    order = (nodes[0].name, *non_head) if par.backend == "ray" else (*non_head, nodes[0].name)
    expert = par.tensor * par.data if par.expert else None
    hybrid = par.dp_load_balancing == "hybrid" and any(n.role is Role.DP_API_ENGINE for n in nodes)
    # external: one node is enough (each rank is its own server whatever the node count), DP > 1 is not
    external = (par.dp_load_balancing == "external" and par.backend == "mp" and par.data > 1
                and not replica_spans_nodes(config))
    mode = "hybrid" if hybrid else "external" if external else "internal"
    topology = Topology(par.backend, par.tensor, par.pipeline, par.data, expert, tuple(nodes), order,
                        replica_nodes, mode)
    return topology, problems


def replica_spans_nodes(config: StackConfig) -> bool:
    """mp, TP x PP larger than some node, and more nodes than replicas: each replica spans N / DP nodes.
    With no more nodes than replicas a replica cannot span nodes: the one-node-per-rank rules apply."""
    par = config.parallelism
    per_replica = par.tensor * par.pipeline
    return (par.backend == "mp" and len(config.nodes) > par.data
            and any(per_replica > node.gpus.count for node in config.nodes))


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
            fix=f"parallelism.data = {capacity_total} for these nodes, or add nodes / set data_parallel_local"
                + ("" if len({n.gpus.count for n in config.nodes}) == 1 else
                   "; or check nodes[].gpus.count (now " + ", ".join(f"{n.name} {n.gpus.count}" for n in config.nodes)
                   + ")")))
    for i, (node, local) in enumerate(zip(config.nodes, locals_, strict=True)):
        if local == 0 and assigned == par.data:
            problems.append(Problem(
                f"nodes.{i}.name", node.name, "this node gets no DP rank and would sit idle",
                fix=f"remove it, or raise parallelism.data to {par.data + node.gpus.count // per_rank}"))
    nodes = []
    start = 0
    # hybrid: every node names its start rank, the head 0 too (vLLM reads a start rank without --headless as
    # hybrid load balancing: vllm/engine/arg_utils.py:2489-2491; internal: the head must not get one).
    # external: every node serves its ranks itself too; the start rank is the node's first rank (the argv names
    # each rank instead: --data-parallel-rank, launch.vllm_args).
    hybrid = par.dp_load_balancing == "hybrid"
    external = par.dp_load_balancing == "external" and par.data > 1
    for i, (node, local) in enumerate(zip(config.nodes, locals_, strict=True)):
        role = (Role.DP_HEAD if i == 0 else Role.DP_API_ENGINE if hybrid else Role.DP_RANK_SERVERS if external
                else Role.HEADLESS_ENGINE)
        nodes.append(NodeTopology(node.name, i, role, node.gpus.count, local * per_rank, local,
                                  start if hybrid or external or i > 0 else None))
        start += local
    return nodes, problems


def _mp_spanning_nodes(config: StackConfig) -> tuple[list[NodeTopology], list[Problem]]:
    """Replicas that span nodes, laid out as vLLM 0.33.0 lays them out from `--nnodes`/`--node-rank`."""
    par = config.parallelism
    n = len(config.nodes)
    per_replica = par.tensor * par.pipeline
    world = per_replica * par.data
    problems: list[Problem] = []
    for i, node in enumerate(config.nodes):
        if node.data_parallel_local is not None:
            problems.append(Problem(
                f"nodes.{i}.data_parallel_local", node.data_parallel_local,
                f"a replica of TP{par.tensor} x PP{par.pipeline} = {per_replica} GPUs spans nodes: every node "
                "holds a share of one replica, never whole DP ranks (vLLM infers --data-parallel-size-local 1)",
                fix="remove data_parallel_local from every node"))
    example = _spanning_example(config)
    if world % n:
        problems.append(Problem(
            "parallelism.pipeline", par.pipeline,
            f"TP{par.tensor} x PP{par.pipeline} x DP{par.data} = {world} GPUs do not split evenly over {n} nodes",
            upstream=f"ValueError: Invalid data-parallel launch options: `--nnodes {n}` must evenly divide the "
                     f"total world size ({world}). (vllm/engine/arg_utils.py:2406-2413)",
            fix=example))
    if n % par.data:
        problems.append(Problem(
            "parallelism.data", par.data, f"{n} nodes do not split into {par.data} equal groups, one per replica",
            upstream=f"ValueError: Invalid data parallel configuration: nnodes ({n}) must be divisible by the "
                     f"number of data parallel node groups ({par.data} = data_parallel_size {par.data} / "
                     "data_parallel_size_local 1) (vllm/config/parallel.py:827-836)",
            fix=example))
    if problems:
        return [NodeTopology(node.name, i, Role.MP_HEAD if i == 0 else Role.MP_WORKER, node.gpus.count, 0,
                             None, None, i, None) for i, node in enumerate(config.nodes)], problems
    share = world // n
    replica_nodes = n // par.data
    nodes: list[NodeTopology] = []
    for i, node in enumerate(config.nodes):
        if share > node.gpus.count:
            problems.append(Problem(
                f"nodes.{i}.gpus.count", node.gpus.count,
                f"each node holds {share} GPUs of a replica (TP{par.tensor} x PP{par.pipeline} x DP{par.data} / "
                f"{n} nodes), node {node.name} has {node.gpus.count}",
                fix=f"more nodes per replica, or tensor x pipeline <= {node.gpus.count * replica_nodes}"))
        replica, within = divmod(i, replica_nodes)
        role = Role.MP_HEAD if i == 0 else Role.MP_REPLICA_HEAD if within == 0 else Role.MP_WORKER
        nodes.append(NodeTopology(node.name, i, role, node.gpus.count, min(share, node.gpus.count),
                                  1 if within == 0 else None, None, i, replica))
    return nodes, problems


def _spanning_example(config: StackConfig) -> str:
    par = config.parallelism
    gpus = min(node.gpus.count for node in config.nodes)
    n = len(config.nodes)
    if n % par.data == 0:
        return (f"{par.data} replica(s) of {n // par.data} node(s) each: tensor x pipeline a multiple of "
                f"{n // par.data}, e.g. tensor: {gpus}, pipeline: {n // par.data}")
    return f"a node count that is a multiple of data ({par.data}), or data: 1 with tensor: {gpus}, pipeline: {n}"

def dp_rank_nodes(ranks_by_node: list[tuple[str, list[int]]]) -> tuple[int, list[str]]:
    """(`--dp-size`, `--rank-nodes`) from the plan's nodes (`[(n.name, n.dp_ranks) for n in plan.nodes]`):
    one node name per DP rank in rank order; (1, []) where nothing is pinned (Ray, or DP 1)."""
    owner = {rank: name for name, ranks in ranks_by_node for rank in ranks}
    if len(owner) <= 1:
        return 1, []
    if sorted(owner) != list(range(len(owner))):
        raise ValueError(f"DP ranks {sorted(owner)} are not 0..{len(owner) - 1}")
    return len(owner), [owner[r] for r in range(len(owner))]


def endpoint_rank_nodes(nodes: list[tuple[str, list[int], str]], load_balancing: str = "internal"
                        ) -> tuple[int, list[str]]:
    """(`--dp-size`, `--rank-nodes`) for checks through the stack's endpoint, from `(name, dp_ranks, role)` per
    node: every rank pinned with internal load balancing; none with hybrid or external, where
    `X-data-parallel-rank` is an index into the ranks of whichever API server the proxy picked (vllm/v1/engine/
    input_processor.py:392-400), so each node's or rank's own server is checked where it runs instead
    (`api-node-<node>`, `api-server-rank-<r>`). `load_balancing`: the plan's mode (`plan.topology`)."""
    if load_balancing != "internal" or any(role in (Role.DP_API_ENGINE.value, Role.DP_RANK_SERVERS.value)
                                           for _, _, role in nodes):
        return 1, []
    return dp_rank_nodes([(name, ranks) for name, ranks, _ in nodes])

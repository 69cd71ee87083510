"""`parallelism.dp_load_balancing`: who spreads requests over the DP ranks, and what vLLM 0.33.0 refuses.

- `internal` (the default): the head's API server balances over every DP rank; the other nodes run `--headless`
  with `--data-parallel-start-rank` (vllm/entrypoints/cli/serve.py:181-266). The head must not get a start rank:
  vLLM reads one without `--headless` as hybrid (vllm/engine/arg_utils.py:2489-2491).
- `hybrid`: every node runs an API server over its own ranks (`--data-parallel-hybrid-lb`,
  `--data-parallel-start-rank`, no `--headless`); rank 0's node still runs the DP coordinator and the DP RPC
  handshake that every engine joins (vllm/v1/engine/core.py:1296-1345), and in front of the nodes the proxy (or
  the user's load balancer) spreads requests. Each API server sends work only to its own engines
  (`local_engines_only`, vllm/config/parallel.py:652-657), so `X-data-parallel-rank` is a node-local index there
  (vllm/v1/engine/input_processor.py:392-400).
- `external`: every DP rank is a vLLM server of its own: `--data-parallel-rank r --data-parallel-size-local 1
  --data-parallel-external-lb` (vllm/engine/arg_utils.py:2447-2485; serve.py picks one API server for it,
  vllm/entrypoints/cli/serve.py:83-85, 113-115), one container per rank on that rank's GPUs, its API on
  `serving.port` + the rank's index on its node. Rank 0 on the head still runs the DP coordinator and the DP RPC
  handshake that every rank's engine dials (vllm/v1/engine/utils.py:1318-1372), and no rank may be headless there
  (`Remote engine 1 must not use --headless in external or hybrid dp lb mode`, vllm/v1/engine/utils.py:1502-1508).
  The proxy (or the user's load balancer) spreads requests over every rank's server; each sends work only to its
  one engine (`local_engines_only`), so no rank header is needed or accepted beyond 0.
"""

from __future__ import annotations

from stacks.model.config import StackConfig
from stacks.model.errors import Problem
from stacks.planner.addresses import api_bind, rank_port
from stacks.planner.model_cards import ModelProfile
from stacks.planner.topology import NodeTopology, Topology, replica_spans_nodes

KEY = "parallelism.dp_load_balancing"
WILDCARDS = ("0.0.0.0", "::")
LOOPBACK = ("127.0.0.1", "::1")

HYBRID_LOCAL_ONE = ("data_parallel_hybrid_lb is not eligible when data_parallel_size_local = 1, autoswitch to "
                    "data_parallel_external_lb. (vllm/engine/arg_utils.py:2493-2501)")
HYBRID_ONE_NODE = ("hybrid turned off: `if data_parallel_size_local == self.data_parallel_size: # Disable hybrid LB "
                   "mode if set for a single node` (vllm/engine/arg_utils.py:2503-2505)")
HYBRID_HEADLESS = ("AssertionError: data_parallel_hybrid_lb is not applicable in headless mode "
                   "(vllm/engine/arg_utils.py:2380-2382, vllm/entrypoints/cli/serve.py:196-197)")
EXTERNAL_SHAPE = ("ValueError: Invalid data-parallel launch options: an external data-parallel rank requires "
                  "`--data-parallel-size-local 1` (vllm/engine/arg_utils.py:2476-2482)")
EXTERNAL_DP_ONE = ("ValueError: data_parallel_external_lb can only be set when data_parallel_size > 1 "
                   "(vllm/config/parallel.py:551-554)")
EXTERNAL_DENSE = ("ValueError: Non-MoE models do not support external data parallel mode. For external load "
                  "balancing, launch independent vLLM instances without --data-parallel-* arguments. "
                  "(vllm/engine/arg_utils.py:2456-2465)")
EXTERNAL_HEADLESS = ("RuntimeError: Remote engine 1 must not use --headless in external or hybrid dp lb mode "
                     "(vllm/v1/engine/utils.py:1502-1508)")
EXTERNAL_ONE_GPU_SET = ("each rank's vLLM has one local DP rank, 0, and takes GPUs [0, TP x PP) of what it sees "
                        "(get_physical_gpu_ids_for_local_dp_rank, vllm/v1/engine/utils.py:439-474)")


def load_balancing_rules(config: StackConfig, topo: Topology, profile: ModelProfile | None = None
                         ) -> tuple[list[Problem], list[str]]:
    """Problems (exit 2) and warnings for the chosen mode; `internal` has none of its own."""
    par = config.parallelism
    mode = par.dp_load_balancing
    if mode == "internal":
        return [], []
    if mode == "external":
        return external_rules(config, topo, profile)
    problems: list[Problem] = []
    if par.backend != "mp":
        problems.append(Problem(
            KEY, mode, "backend ray runs one replica (DP 1) through Ray's executor: there are no DP ranks to balance, "
            "and the load-balancing flags act on vLLM's mp data parallelism (--data-parallel-backend mp)",
            fix="backend: mp with data > 1, or dp_load_balancing: internal"))
        return problems, []
    if par.data == 1:
        problems.append(Problem(KEY, mode, "data is 1: one engine, nothing to balance", upstream=HYBRID_ONE_NODE,
                                fix="dp_load_balancing: internal, or data > 1 over several nodes"))
        return problems, []
    if replica_spans_nodes(config):
        problems.append(Problem(
            KEY, mode, f"a replica of TP{par.tensor} x PP{par.pipeline} spans nodes: every node after a replica's "
            "first runs workers only and must be --headless (vllm/entrypoints/cli/serve.py:218-233), which hybrid "
            "refuses, and each node holds one share of one rank, never the 2 or more local ranks hybrid needs",
            upstream=HYBRID_HEADLESS, fix="dp_load_balancing: internal (the head's API server balances over the "
            "replicas), or tensor x pipeline <= GPUs per node with 2 or more DP ranks per node"))
        return problems, []
    if len(config.nodes) == 1:
        problems.append(Problem(KEY, mode, "one node holds every DP rank: its API server already balances over all "
                                "of them", upstream=HYBRID_ONE_NODE,
                                fix="dp_load_balancing: internal, or more nodes"))
        return problems, []
    for node in topo.nodes:
        if node.dp_local == 1:
            given = config.nodes[node.index].data_parallel_local is not None
            problems.append(Problem(
                f"nodes.{node.index}.data_parallel_local" if given else KEY,
                1 if given else mode,
                f"node {node.name} holds 1 DP rank: vLLM does not run hybrid load balancing there but silently "
                "switches that node to external load balancing", upstream=HYBRID_LOCAL_ONE,
                fix=f"2 or more DP ranks on every node (TP{par.tensor} x PP{par.pipeline} x 2 <= its GPUs), or "
                    "dp_load_balancing: internal"))
    host, proxy = config.serving.host, config.api.proxy.enabled
    if host not in WILDCARDS and host not in LOOPBACK:
        problems.append(Problem(
            "serving.host", host, f"with {KEY}: hybrid every node runs an API server, and the nodes after the head "
            "cannot bind one of the head's addresses", fix="0.0.0.0 (every node, behind the firewall), or "
            "127.0.0.1 with api.proxy.enabled (each other node then binds its fabric.control_plane address, the first "
            "of its data_ips or its management_ip, where only the head's nginx is admitted)"))
    elif host in LOOPBACK and not proxy:
        problems.append(Problem(
            "serving.host", host, f"with {KEY}: hybrid and no api.proxy, the API servers of the nodes after the head "
            "would bind loopback too, where no load balancer reaches them: their ranks would get no requests",
            fix="api.proxy.enabled: true (nginx on the head spreads requests over every node), or 0.0.0.0 and your "
                "own load balancer over every node's API port"))
    warnings: list[str] = []
    if not problems and proxy and not config.firewall.enabled:
        others = ", ".join(f"{api_bind(config, n)}:{config.serving.port}" for n in topo.nodes[1:])
        warnings.append(
            f"{KEY}: hybrid behind api.proxy with firewall.enabled: false: the other nodes' vLLM ({others}) admits "
            "every host that reaches it, and its api_key guards only /v1 paths: /invocations, /tokenize, /pause, "
            "/metrics, /collective_rpc there bypass the proxy's keys and allowlist; turn the firewall on (it then "
            "admits only the head's nginx) or filter those ports yourself")
    if not problems and not proxy:
        others = ", ".join(f"{config.nodes[n.index].management_ip}:{config.serving.port}" for n in topo.nodes[1:])
        warnings.append(
            f"{KEY}: hybrid without api.proxy: the stack's endpoint is the head's API server, which sends requests "
            f"only to the head's own DP ranks; put a load balancer over every node's API server (the head's and "
            f"{others}), or turn on api.proxy, which does")
    return problems, warnings


def external_rules(config: StackConfig, topo: Topology, profile: ModelProfile | None
                   ) -> tuple[list[Problem], list[str]]:
    """`external`: what vLLM 0.33.0 refuses for a rank of its own, and what the rank servers need from the stack
    (their GPUs, their ports, a load balancer that reaches them)."""
    par = config.parallelism
    if par.backend != "mp":
        return [Problem(KEY, "external", "backend ray runs one replica (DP 1) through Ray's executor: there are no "
                        "DP ranks to serve one by one", upstream=EXTERNAL_DP_ONE,
                        fix="backend: mp with data > 1, or dp_load_balancing: internal")], []
    if par.data == 1:
        return [Problem(KEY, "external", "data is 1: one engine, no DP ranks to serve one by one",
                        upstream=EXTERNAL_DP_ONE, fix="dp_load_balancing: internal, or data > 1")], []
    if replica_spans_nodes(config):
        return [Problem(
            KEY, "external", f"a replica of TP{par.tensor} x PP{par.pipeline} spans nodes: each rank would be a "
            "server whose workers run --headless on other nodes (--nnodes), a layout this tool does not plan for "
            "external load balancing; a rank's own engine must never be headless there", upstream=EXTERNAL_HEADLESS,
            fix="dp_load_balancing: internal (the head's API server balances over the replicas), or tensor x "
                "pipeline <= GPUs per node")], []
    problems: list[Problem] = []
    if profile is not None and not profile.moe:
        problems.append(Problem(
            KEY, "external", f"{profile.key} is a dense model: vLLM 0.33.0 refuses external DP ranks for it (its DP "
            "ranks share nothing, so they are plain independent servers)", upstream=EXTERNAL_DENSE,
            fix="dp_load_balancing: internal or hybrid, or one stack per replica behind your load balancer"))
    if not config.container.set_cuda_visible_devices:
        problems.append(Problem(
            "container.set_cuda_visible_devices", False, f"with {KEY}: external every DP rank runs in a container "
            f"of its own that would see every GPU of the node, and {EXTERNAL_ONE_GPU_SET}: every rank of a node "
            "would load onto the same GPUs", fix="true (each rank's container then gets its own GPUs)"))
    if "CUDA_VISIBLE_DEVICES" in config.container.managed_env_overrides:
        problems.append(Problem(
            "container.managed_env_overrides.CUDA_VISIBLE_DEVICES",
            config.container.managed_env_overrides["CUDA_VISIBLE_DEVICES"],
            f"with {KEY}: external one value for every rank's container: {EXTERNAL_ONE_GPU_SET}, so every rank "
            "of a node would load onto the same GPUs", fix="remove it (each rank's container gets its own GPUs)"))
    most = max((len(n.dp_ranks) for n in topo.nodes), default=1)
    if config.serving.port + most - 1 > 65535:
        problems.append(Problem(
            "serving.port", config.serving.port, f"with {KEY}: external the DP ranks of a node listen on "
            f"serving.port to serving.port + {most - 1} ({most} ranks on one node), past 65535",
            fix=f"at most {65535 - most + 1}"))
    host, proxy = config.serving.host, config.api.proxy.enabled
    several = len(config.nodes) > 1
    if several and host not in WILDCARDS and host not in LOOPBACK:
        problems.append(Problem(
            "serving.host", host, f"with {KEY}: external the DP rank servers of the nodes after the head cannot "
            "bind one of the head's addresses", fix="0.0.0.0 (every rank's server, behind the firewall), or "
            "127.0.0.1 with api.proxy.enabled (the other nodes' rank servers then bind their fabric.control_plane "
            "address, where only the head's nginx is admitted)"))
    elif host in LOOPBACK and not proxy:
        problems.append(Problem(
            "serving.host", host, f"with {KEY}: external and no api.proxy, every rank's server binds loopback, "
            "where no load balancer reaches them: only rank 0's would be the endpoint, the other ranks would get "
            "no requests", fix="api.proxy.enabled: true (nginx on the head spreads requests over every rank's "
            "server), or 0.0.0.0 and your own load balancer over every rank's port"))
    warnings: list[str] = []
    if problems or not all(n.dp_ranks for n in topo.nodes):  # a node without ranks: the topology rule says so
        return problems, warnings
    def ports(n: NodeTopology) -> str:
        first, last = rank_port(config, n, n.dp_ranks[0]), rank_port(config, n, n.dp_ranks[-1])
        return f"{first}-{last}" if last != first else str(first)

    if proxy and not config.firewall.enabled and several:
        others = ", ".join(f"{api_bind(config, n)}:{ports(n)}" for n in topo.nodes[1:])
        warnings.append(
            f"{KEY}: external behind api.proxy with firewall.enabled: false: the other nodes' rank servers "
            f"({others}) admit every host that reaches them, and vLLM's api_key guards only /v1 paths: "
            "/invocations, /tokenize, /pause, /metrics, /collective_rpc there bypass the proxy's keys and allowlist; "
            "turn the firewall on (it then admits only the head's nginx) or filter those ports yourself")
    if not proxy:
        def where(n: NodeTopology) -> str:
            address = config.nodes[n.index].management_ip if api_bind(config, n) in WILDCARDS else api_bind(config, n)
            return f"{address}:{ports(n)}"

        warnings.append(
            f"{KEY}: external without api.proxy: the stack's endpoint is DP rank 0's own server, which sends "
            f"requests only to its own engine; put a load balancer over every rank's server "
            f"({', '.join(where(n) for n in topo.nodes)}), or turn on api.proxy, which does")
    return problems, warnings

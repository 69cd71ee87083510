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
- `external`: one API server per DP rank (`--data-parallel-rank`, `--data-parallel-size-local 1`,
  vllm/engine/arg_utils.py:2447-2485) or 0.33.0's per-node supervisor (`--data-parallel-multi-port-external-lb`:
  one API port per local rank plus a supervisor health port, vllm/entrypoints/launchers/dp_supervisor.py:52-115).
  Its ports, firewall and per-rank checks are not planned yet, so it is refused rather than half-built.
"""

from __future__ import annotations

from stacks.model.config import StackConfig
from stacks.model.errors import Problem
from stacks.planner.topology import Topology, replica_spans_nodes

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


def load_balancing_rules(config: StackConfig, topo: Topology) -> tuple[list[Problem], list[str]]:
    """Problems (exit 2) and warnings for the chosen mode; `internal` has none of its own."""
    par = config.parallelism
    mode = par.dp_load_balancing
    if mode == "internal":
        return [], []
    if mode == "external":
        return [Problem(
            KEY, mode, "external load balancing runs one vLLM API server per DP rank (--data-parallel-rank with "
            "--data-parallel-size-local 1, or 0.33.0's --data-parallel-multi-port-external-lb supervisor with one "
            "API port per local rank and a health port); this tool does not plan those servers, their ports, "
            "firewall and per-rank checks yet", upstream=EXTERNAL_SHAPE,
            fix="hybrid (one API server per node; api.proxy or your load balancer spreads over the nodes), or "
                "internal")], []
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
        from stacks.planner.launch import api_bind

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

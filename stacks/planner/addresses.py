"""Where each node's vLLM API server binds, on which port each DP rank's own server listens, and where a process on
the node (or the head's nginx) reaches it: one answer for the containers (`launch`), the listener table
(`listeners`), the proxy's upstreams (`proxy`), the scrape targets (`observability`) and the load-balancing rules.
"""

from __future__ import annotations

from stacks.model.config import StackConfig
from stacks.planner.fabric import control_ip
from stacks.planner.topology import NodeTopology


def api_bind(config: StackConfig, node: NodeTopology) -> str:
    """The address a node's API server binds: `serving.host` on the head and wherever it is a wildcard. With
    hybrid load balancing behind the proxy the head's vLLM stays on loopback (only nginx beside it reaches it),
    while every other node's binds that node's `fabric.control_plane` address (`fabric.control_ip`: the first of
    its data_ips, or its management_ip), where the head's nginx reaches it from the head's own such address (the
    firewall admits only that address there, `listeners.proxy_upstream_sources`; vLLM still wants api_key)."""
    host = config.serving.host
    if node.index == 0 or host in ("0.0.0.0", "::"):
        return host
    return str(control_ip(config, config.nodes[node.index]) or config.nodes[node.index].management_ip)


def rank_port(config: StackConfig, node: NodeTopology, rank: int) -> int:
    """External load balancing: the API port of DP rank `rank`'s own server, `serving.port` + its index among the
    node's ranks (0.33.0's multi-port supervisor numbers them the same way: `args.port + local_rank`,
    vllm/entrypoints/launchers/dp_supervisor.py:118-124)."""
    return config.serving.port + node.dp_ranks.index(rank)


def node_api_host(config: StackConfig, node: NodeTopology) -> str:
    """Where a process on the node itself reaches its API server (loopback when it binds all addresses)."""
    bind = api_bind(config, node)
    return {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(bind, bind)


def local_api_host(config: StackConfig) -> str:
    """Where a process on the head reaches vLLM's API: the bind address, or loopback when it binds all."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(config.serving.host, config.serving.host)

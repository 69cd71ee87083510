"""Per-node network environment: VLLM_HOST_IP, NCCL_* and GLOO_* from the node's NICs, HCAs and GID (and NVSHMEM_*
with a DeepEP all-to-all backend, stacks/planner/deepep.py).

Interface lists get NCCL's `=` prefix by default: without it `ens1` would also match `ens11np0`.
"""

from __future__ import annotations

from stacks.model.config import NodeConfig, StackConfig
from stacks.model.errors import Problem
from stacks.planner import deepep


def control_ip(config: StackConfig, node: NodeConfig) -> str | None:
    """The address vLLM, Gloo, DP RPC and Ray use for this node."""
    if config.fabric.control_plane == "management":
        return node.management_ip
    return node.data_ips[0] if node.data_ips else None


def _control_ifname(config: StackConfig, node: NodeConfig) -> str | None:
    if config.fabric.control_plane == "management":
        return node.management_ifname
    return node.nics[0] if node.nics else None


def _socket_ifnames(config: StackConfig, node: NodeConfig) -> list[str]:
    if config.fabric.nccl_socket == "management":
        return [node.management_ifname] if node.management_ifname else []
    return list(node.nics)


def fabric_problems(config: StackConfig) -> list[Problem]:
    problems: list[Problem] = []
    fabric = config.fabric
    for i, node in enumerate(config.nodes):
        if fabric.control_plane == "data" and not node.data_ips:
            problems.append(Problem(f"nodes.{i}.data_ips", node.data_ips,
                                    "fabric.control_plane is 'data' but this node has no data-plane IP",
                                    fix="list the node's data IPs, or set fabric.control_plane: management"))
        if "management" in (fabric.control_plane, fabric.nccl_socket) and not node.management_ifname:
            problems.append(Problem(f"nodes.{i}.management_ifname", None,
                                    "the management network is used for Gloo/NCCL sockets but its interface "
                                    "is not named", fix="e.g. management_ifname: bond0"))
        if fabric.nccl_socket == "data" and not node.nics:
            problems.append(Problem(f"nodes.{i}.nics", node.nics, "NCCL sockets use the data NICs, none listed",
                                    fix="list the data-plane NICs, e.g. [ens11np0, ens13np0]"))
        if node.data_ips and node.nics and len(node.data_ips) != len(node.nics):
            problems.append(Problem(f"nodes.{i}.data_ips", node.data_ips,
                                    f"{len(node.data_ips)} data IPs for {len(node.nics)} NICs",
                                    fix="one IP per NIC, in the same order"))
        if fabric.transport in ("roce", "ib") and not node.hcas:
            problems.append(Problem(f"nodes.{i}.hcas", node.hcas,
                                    f"fabric.transport is {fabric.transport!r} but no HCA is listed; NCCL would "
                                    "pick any HCA or fall back to sockets (NET/Socket)",
                                    fix="e.g. hcas: ['mlx5_0:1'], or fabric.transport: socket"))
    problems += deepep.nic_handler_problems(config)
    return problems


def node_env(config: StackConfig, node: NodeConfig) -> dict[str, str]:
    """The fabric part of a node's container environment, in a stable, readable order."""
    fabric = config.fabric
    prefix = "=" if fabric.exact_ifnames else ""
    env: dict[str, str] = {}
    host_ip = control_ip(config, node)
    if host_ip:
        env["VLLM_HOST_IP"] = host_ip
    if fabric.nccl_debug:
        env["NCCL_DEBUG"] = fabric.nccl_debug
    if fabric.nccl_net:
        env["NCCL_NET"] = fabric.nccl_net
    sockets = _socket_ifnames(config, node)
    if sockets:
        env["NCCL_SOCKET_IFNAME"] = prefix + ",".join(sockets)
    gloo = _control_ifname(config, node)
    if gloo:
        env["GLOO_SOCKET_IFNAME"] = gloo
    if fabric.transport in ("roce", "ib"):
        if node.hcas:
            env["NCCL_IB_HCA"] = prefix + ",".join(node.hcas)
        if node.gid_index is not None:
            env["NCCL_IB_GID_INDEX"] = str(node.gid_index)
        env["NCCL_IB_DISABLE"] = "0"
    else:
        env["NCCL_IB_DISABLE"] = "1"
    env.update(deepep.nvshmem_env(node, fabric, deepep.configured_backend(config)))
    env.update(fabric.env)
    return env

"""RdmaFabric: the network side of every node — NCCL/Gloo/VLLM_HOST_IP env, fabric preflight, NCCL evidence.

Two phases, because the evidence needs a running engine: the fabric preflight gates the engine, and
`verify_transport` adds the NCCL-transport checks once the API answers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_command as command

from components.gpu_node import GpuNode


@dataclass(frozen=True)
class FabricNodeArgs:
    node: GpuNode
    env: Mapping[str, str]
    """The fabric part of the node's container env, as the plan derived it."""
    preflight_command: str | None
    """None where the stack runs NCCL over sockets (no RDMA to check)."""
    triggers: list[str]


class RdmaFabric(pulumi.ComponentResource):
    preflights: dict[str, command.remote.Command]
    transport_checks: dict[str, command.remote.Command]

    def __init__(self, name: str, nodes: Mapping[str, FabricNodeArgs],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("vllm-cluster:index:RdmaFabric", name, None, opts)
        self._prefix = name
        self._nodes = dict(nodes)
        self.preflights = {}
        self.transport_checks = {}
        for node_name, args in nodes.items():
            if args.preflight_command is None:
                continue
            self.preflights[node_name] = command.remote.Command(
                f"{name}-{node_name}-fabric-preflight", connection=args.node.connection,
                create=args.preflight_command, triggers=list(args.triggers),
                opts=pulumi.ResourceOptions(parent=self))

    def verify_transport(self, commands: Mapping[str, str], after: Sequence[pulumi.Resource],
                         triggers: list[pulumi.Input[str]]) -> None:
        """NCCL transport from each engine's logs; re-runs whenever the engine generation changes."""
        for node_name, check in commands.items():
            self.transport_checks[node_name] = command.remote.Command(
                f"{self._prefix}-{node_name}-nccl-transport", connection=self._nodes[node_name].node.connection,
                create=check, triggers=list(triggers),
                opts=pulumi.ResourceOptions(parent=self, depends_on=list(after)))
        self.register_outputs({
            "env": {name: dict(args.env) for name, args in self._nodes.items()},
            "transport": {name: c.stdout for name, c in self.transport_checks.items()},
        })

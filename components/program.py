"""The Pulumi program: config -> plan -> GpuNode, RdmaFabric, VllmEngine, ApiEndpoint, and the exports.

The config is validated by the same code as `python -m stacks plan`; a bad config raises before any
resource is registered, so nothing is ever half-deployed by a typo.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pulumi

from components.api_endpoint import ApiEndpoint, ApiEndpointArgs
from components.check_commands import (
    api_command,
    engines_command,
    nccl_command,
    preflight_command,
    ray_ready_command,
)
from components.gpu_node import GpuNode, GpuNodeArgs
from components.rdma_fabric import FabricNodeArgs, RdmaFabric
from components.vllm_engine import VllmEngine, VllmEngineArgs
from stacks.config import CONFIG_KEYS, SECRET_KEYS, SECRET_MARKER, StackConfig
from stacks.errors import ConfigError
from stacks.fabric import node_env
from stacks.loader import PROJECT, parse_config
from stacks.plan import API_CHECKS, Plan, build_plan, roles


def read_config() -> tuple[dict[str, Any], dict[str, pulumi.Output[str]]]:
    """Plain values from `pulumi.Config`, and the secrets as Outputs (the model only sees a marker)."""
    cfg = pulumi.Config(PROJECT)
    values: dict[str, Any] = {}
    secrets: dict[str, pulumi.Output[str]] = {}
    for key in CONFIG_KEYS:
        if key in SECRET_KEYS:
            secret = cfg.get_secret(key)
            if secret is not None:
                secrets[key] = secret
                values[key] = SECRET_MARKER
            continue
        value = cfg.get_object(key)
        if value is not None:
            values[key] = value
    return values, secrets


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def deploy(stack: str) -> dict[str, Any]:
    values, secrets = read_config()
    try:
        config = parse_config(stack, values)
        plan = build_plan(stack, config)
    except ConfigError as exc:
        raise pulumi.RunError(exc.report()) from None
    for warning in plan.warnings:
        pulumi.log.warn(warning)
    return build(stack, config, plan, secrets)


def build(stack: str, config: StackConfig, plan: Plan, secrets: dict[str, pulumi.Output[str]]) -> dict[str, Any]:
    checks = {c.name: c for c in plan.checks}
    model_id = _digest(config.model.model_dump())
    nodes: dict[str, GpuNode] = {}
    fabric_args: dict[str, FabricNodeArgs] = {}
    for node in config.nodes:
        fabric_id = _digest([node.model_dump(), config.fabric.model_dump()])
        triggers = [config.image.pull_ref, model_id, fabric_id]
        nodes[node.name] = GpuNode(node.name, GpuNodeArgs(
            name=node.name, ssh_host=node.ssh.host, ssh_user=node.ssh.user, ssh_port=node.ssh.port,
            image=config.image.pull_ref,
            preflight_command=preflight_command(config, plan, checks[f"preflight-{node.name}"]),
            preflight_triggers=triggers, ssh_private_key=secrets.get("ssh_private_key")))
        fabric_check = checks.get(f"fabric-{node.name}")
        fabric_args[node.name] = FabricNodeArgs(
            node=nodes[node.name], env=node_env(config, node),
            preflight_command=preflight_command(config, plan, fabric_check) if fabric_check else None,
            triggers=[fabric_id])
    fabric = RdmaFabric("fabric", fabric_args)
    gates: list[pulumi.Resource] = [*(n.preflight for n in nodes.values()), *fabric.preflights.values()]
    engine = VllmEngine("engine", VllmEngineArgs(
        plan=plan, nodes=nodes, gates=gates,
        secrets={"VLLM_API_KEY": secrets["api_key"]} if "api_key" in secrets else {},
        ray_ready_command=ray_ready_command(config, plan) if "ray-cluster" in checks else None))
    smoke = [c for c in API_CHECKS if f"api-{c}" in checks and c != "health"]
    api_settings = _digest(config.api.model_dump())
    api = ApiEndpoint("api", ApiEndpointArgs(
        endpoint=plan.endpoint, served_model=config.model.served_name,
        health_command=api_command(config, plan, ["health"], "api-health"),
        smoke_command=api_command(config, plan, smoke, "api-smoke"),
        triggers=[engine.generation, api_settings], after=engine.ready, api_key=secrets.get("api_key")))
    engine.verify_engines({c.node or "": engines_command(plan, c) for c in plan.checks
                           if c.module == "checks.engines"}, after=[api.health])
    fabric.verify_transport({c.node or "": nccl_command(config, plan, c) for c in plan.checks
                             if c.module == "checks.nccl_transport"}, after=[api.health],
                            triggers=[engine.generation])
    outputs: dict[str, Any] = {
        "endpoint": api.endpoint,
        "image": config.image.pull_ref,
        "topology": {k: plan.topology[k] for k in ("backend", "nodes", "tensor", "pipeline", "data", "expert")},
        "nodes": roles(plan),
        "served_model": api.served_model,
        "verification": api.verification,
    }
    for key, value in outputs.items():
        pulumi.export(key, value)
    return {"outputs": outputs, "nodes": nodes, "fabric": fabric, "engine": engine, "api": api}

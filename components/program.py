"""The Pulumi program: config -> plan -> GpuNode, RdmaFabric, VllmEngine, ApiEndpoint, and the exports.

The config is validated by the same code as `python -m stacks plan`; a bad config raises before any
resource is registered, so nothing is ever half-deployed by a typo.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import pulumi
from pulumi.runtime.config import get_config

from components.api_endpoint import ApiEndpoint, ApiEndpointArgs, ProxyArgs
from components.check_commands import (
    api_command,
    dry_run_command,
    engines_command,
    nccl_command,
    preflight_command,
    ray_ready_command,
)
from components.gpu_node import GpuNode, GpuNodeArgs
from components.rdma_fabric import FabricNodeArgs, RdmaFabric
from components.vllm_engine import VllmEngine, VllmEngineArgs
from stacks.config import CONFIG_KEYS, SECRET_KEYS, SECRET_MARKER, SECRET_OBJECT_KEYS, StackConfig
from stacks.errors import ConfigError
from stacks.fabric import node_env
from stacks.loader import PROJECT, parse_config
from stacks.plan import API_CHECKS, CheckSpec, Plan, build_plan, check_client, roles
from stacks.proxy import ProxyKeyError, render_nginx_conf


def read_config() -> tuple[dict[str, Any], dict[str, pulumi.Output[Any]]]:
    """Plain values from `pulumi.Config`, and the secrets as Outputs (the model only sees a marker)."""
    cfg = pulumi.Config(PROJECT)
    values: dict[str, Any] = {}
    secrets: dict[str, pulumi.Output[Any]] = {}
    for key in CONFIG_KEYS:
        if key in SECRET_OBJECT_KEYS:
            raw = get_config(f"{PROJECT}:{key}")
            if raw is not None:
                # Only the names become plain values (they are reviewable); the keys stay in a secret Output.
                names = json.loads(raw) if isinstance(raw, str) else raw
                values[key] = {name: SECRET_MARKER for name in names} if isinstance(names, dict) else SECRET_MARKER
                secrets[key] = pulumi.Output.secret(cfg.require_secret_object(key))
            continue
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


def _proxy_args(config: StackConfig, head: GpuNode, secrets: dict[str, pulumi.Output[Any]]) -> ProxyArgs:
    """nginx.conf is rendered inside an apply: it needs the keys, so it exists only as a secret Output."""
    proxy = config.api.proxy

    def render(values: list[Any]) -> str:
        keys, upstream = values
        try:
            return render_nginx_conf(proxy, config.serving.port, {str(k): str(v) for k, v in keys.items()},
                                     str(upstream))
        except ProxyKeyError as exc:
            raise pulumi.RunError(f"api.proxy: {exc}") from None

    # Secret because its inputs are; ApiEndpoint marks the upload secret again.
    conf: pulumi.Output[str] = pulumi.Output.all(secrets["proxy_keys"], secrets["api_key"]).apply(render)
    return ProxyArgs(provider=head.provider, image=proxy.image.pull_ref, container_name=proxy.container_name,
                     conf=conf, certificate=secrets.get("tls_certificate") if proxy.tls else None,
                     private_key=secrets.get("tls_private_key") if proxy.tls else None)


def _node_commands(plan: Plan, module: str, command: Callable[[CheckSpec], str]) -> dict[str, str]:
    """Node name -> shell command, for every planned check of one module."""
    return {c.node or "": command(c) for c in plan.checks if c.module == module}


def build(stack: str, config: StackConfig, plan: Plan, secrets: dict[str, pulumi.Output[Any]]) -> dict[str, Any]:
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
    gates: dict[str, list[pulumi.Resource]] = {
        name: [node.preflight, *([fabric.preflights[name]] if name in fabric.preflights else [])]
        for name, node in nodes.items()}
    engine = VllmEngine("engine", VllmEngineArgs(
        plan=plan, nodes=nodes, gates=gates,
        secrets={"VLLM_API_KEY": secrets["api_key"]} if "api_key" in secrets else {},
        dry_run_commands=_node_commands(plan, "checks.vllm_args", lambda c: dry_run_command(config, plan, c)),
        ray_ready_command=ray_ready_command(config, plan) if "ray-cluster" in checks else None))
    smoke = [c for c in API_CHECKS if f"api-{c}" in checks and c != "health"]
    api_settings = _digest(config.api.model_dump())
    client = check_client(config)
    check_key = secrets["proxy_keys"].apply(lambda keys: str(keys[client])) if client else secrets.get("api_key")
    api = ApiEndpoint("api", ApiEndpointArgs(
        endpoint=plan.endpoint, served_model=config.model.served_name,
        health_command=api_command(config, plan, ["health"], "api-health"),
        smoke_command=api_command(config, plan, smoke, "api-smoke"),
        triggers=[engine.generation, api_settings], after=engine.ready, api_key=check_key,
        tls_ca=secrets.get("tls_certificate") if plan.proxy and plan.proxy.tls else None,
        proxy=_proxy_args(config, nodes[config.head.name], secrets) if plan.proxy else None))
    engine.verify_engines(_node_commands(plan, "checks.engines", lambda c: engines_command(plan, c)),
                          after=[api.health])
    fabric.verify_transport(_node_commands(plan, "checks.nccl_transport", lambda c: nccl_command(config, plan, c)),
                            after=[api.health], triggers=[engine.generation])
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

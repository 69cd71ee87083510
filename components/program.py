"""The Pulumi program: config -> plan -> GpuNode, RdmaFabric, VllmEngine, ApiEndpoint, and the exports.

The config is validated by the same code as `python -m stacks plan`; a bad config raises before any
resource is registered, so nothing is ever half-deployed by a typo.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import json
import shlex
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pulumi_command as command
from pulumi.runtime import config as runtime_config
from pulumi.runtime.config import get_config_env, get_config_secret_keys_env, is_config_secret

from checks.bundle import heredoc_command
from checks.preflight import outer_timeout_s
from checks.weights_node import credentials_stdin, weights_hash
from components.api_endpoint import ApiEndpoint, ApiEndpointArgs, ProxyArgs
from components.check_commands import (
    api_command,
    collective_command,
    deepep_host_command,
    dry_run_command,
    engines_command,
    nccl_command,
    node_api_command,
    page_cache_command,
    preflight_command,
    ray_ready_command,
    server_rank,
    weights_command,
    weights_match_command,
    weights_prune_command,
)
from components.collective_check import collective_runs
from components.gpu_node import GpuNode, GpuNodeArgs
from components.observability import Observability, ObservabilityArgs
from components.pd_router import pd_router
from components.policy_facts import PolicyFacts
from components.rdma_fabric import FabricNodeArgs, RdmaFabric
from components.ssh_trust import docker_ssh_opts, write_known_hosts
from components.vllm_engine import VllmEngine, VllmEngineArgs, secrets_trigger, weights_trigger
from stacks.model.config import SECRET_KEYS, SECRET_OBJECT_KEYS, StackConfig
from stacks.model.errors import ConfigError, Problem
from stacks.model.field_types import SECRET
from stacks.model.loader import parse_config, read_stack_document, secret_problems
from stacks.model.stack_file import PROJECT, decode_top_level, near_miss, split_config_key
from stacks.planner.addresses import local_api_host
from stacks.planner.container_spec import GENERATION_LABEL
from stacks.planner.fabric import node_env
from stacks.planner.firewall import firewall_commands, preflight_args
from stacks.planner.groups import GroupContext
from stacks.planner.plan import (
    CheckSpec,
    Plan,
    api_on_head,
    api_sections,
    check_client,
    min_busbw_gbps,
    roles,
)
from stacks.planner.proxy import ProxyConfigError, ProxyKeyError, front_door, render_nginx_conf
from stacks.planner.rolling import drain_script, undrain_script
from stacks.planner.stack_plan import StackPlan, build_stack


def _entry(whole: pulumi.Output[Any], name: str) -> pulumi.Output[str]:
    """One value of a secret object, still secret."""
    return whole.apply(lambda values: str(values[name]))


def _pulumi_config() -> tuple[dict[str, str], set[str]]:
    """Every config value the engine passed to this program (full key -> text), and which keys are secrets.

    The language host hands them over in PULUMI_CONFIG / PULUMI_CONFIG_SECRET_KEYS and `set_all_config`
    (pulumi `sdk/python/cmd/pulumi-language-python-exec`); both places are read."""
    raw = {**get_config_env(), **runtime_config.CONFIG.get()}
    secret = {k for k in raw if is_config_secret(k)} | set(get_config_secret_keys_env())
    return {str(k): str(v) for k, v in raw.items()}, secret


def read_config(stack: str) -> tuple[dict[str, Any], dict[str, pulumi.Output[Any]]]:
    """Plain values and secret Outputs from Pulumi's config; the model only ever sees the SECRET marker.

    Raises ConfigError, before any resource registers, for a key that Pulumi holds in plain text where a
    secret belongs (Pulumi would decrypt nothing and deploy it as is), a secret where plain config belongs
    (it would be decrypted into plain resource inputs), a near-miss of the namespace, and - when the stack
    file is at hand - a plain leaf inside proxy_keys / env_secrets that Pulumi's per-key flag cannot show."""
    raw, secret_keys = _pulumi_config()
    values: dict[str, Any] = {}
    secrets: dict[str, pulumi.Output[Any]] = {}
    problems: list[Problem] = []
    for full_key, text in raw.items():
        namespace, name = split_config_key(full_key, PROJECT)
        if namespace != PROJECT:
            if namespace is not None and near_miss(namespace):
                problems.append(Problem(full_key, "…", f"namespace {namespace!r} is not {PROJECT!r}: nothing reads "
                                        "this key", fix=f"{PROJECT}:{name}"))
            continue
        value = decode_top_level(text)
        is_secret = full_key in secret_keys
        if name in SECRET_KEYS:
            values[name] = SECRET if is_secret else text
            if is_secret:
                secrets[name] = pulumi.Output.secret(text)
        elif name in SECRET_OBJECT_KEYS:
            if is_secret and isinstance(value, dict):
                # Only the names become plain values (they are reviewable); the values stay in a secret Output.
                values[name] = {str(k): SECRET for k in value}
                whole = pulumi.Output.secret(value)
                secrets[name] = whole
                for entry in value:
                    secrets[f"{name}.{entry}"] = _entry(whole, str(entry))
            else:
                values[name] = value if not is_secret else SECRET
        else:
            values[name] = SECRET if is_secret else value
    stack_path = Path.cwd() / f"Pulumi.{stack}.yaml"
    if stack_path.is_file():
        try:
            in_file = read_stack_document(stack, Path.cwd()).values
        except ConfigError as exc:
            problems += exc.problems
        else:
            leaf_problems, _ = secret_problems(in_file)
            problems += [p for p in leaf_problems if p.key.split(".")[0] in SECRET_OBJECT_KEYS or p.value is SECRET]
    if problems:
        raise ConfigError(stack, problems)
    return values, secrets


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


FULL_COLLECTION_THRESHOLD = 1_000_000
"""CPython's third `gc` threshold while the program runs: in effect, no full collection before it ends."""


def defer_full_collections() -> None:
    """Every resource the program registers stays alive, with its inputs, futures and pending coroutine, until the
    engine has answered for it, so the heap grows with the nodes and each of CPython's full (oldest-generation)
    collections walks all of it: at 128 nodes they took about a third of the program's CPU time, and they were what
    made its time per node grow. The program keeps little cyclic garbage (the heap at 128 nodes is the same
    size with the collector off), so full collections wait until the language host's process ends; young
    collections still run. `restored_gc` puts the settings back for callers that run the program in process."""
    gc.set_threshold(*gc.get_threshold()[:2], FULL_COLLECTION_THRESHOLD)


@contextlib.contextmanager
def restored_gc() -> Iterator[None]:
    """For in-process runs of `deploy` (the mocks harness, the replacement matrix): the collector's thresholds
    as they were before, afterwards."""
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


def deploy(stack: str) -> dict[str, Any]:
    defer_full_collections()
    try:
        values, secrets = read_config(stack)
        config = parse_config(stack, values)
        whole = build_stack(stack, config)
    except ConfigError as exc:
        raise pulumi.RunError(exc.report()) from None
    for warning in dict.fromkeys(w for g in whole.groups for w in g.plan.warnings):
        pulumi.log.warn(warning)
    if not whole.grouped:
        return build(stack, config, whole.groups[0].plan, secrets)
    return build_groups(stack, config, whole, secrets)


def _proxy_args(config: StackConfig, head: GpuNode, secrets: dict[str, pulumi.Output[Any]],
                group: GroupContext | None = None) -> ProxyArgs:
    """nginx.conf is rendered inside an apply: it needs the keys, so it exists only as a secret Output. `group`: the
    replica group that holds the front door (its upstreams then include every other group's API server)."""
    proxy = config.api.proxy
    door = front_door(config, group)

    def render(values: list[Any]) -> str:
        keys, upstream = values
        try:
            return render_nginx_conf(door, {str(k): str(v) for k, v in keys.items()}, str(upstream))
        except (ProxyKeyError, ProxyConfigError) as exc:
            raise pulumi.RunError(f"api.proxy: {exc}") from None

    # Secret because its inputs are; ApiEndpoint marks the upload secret again.
    conf: pulumi.Output[str] = pulumi.Output.all(secrets["proxy_keys"], secrets["api_key"]).apply(render)
    return ProxyArgs(provider=head.provider, image=proxy.image.pull_ref, container_name=proxy.container_name,
                     conf=conf, certificate=secrets.get("tls_certificate") if proxy.tls else None,
                     private_key=secrets.get("tls_private_key") if proxy.tls else None)


def _node_commands(plan: Plan, module: str, build: Callable[[CheckSpec], str]) -> dict[str, str]:
    """Node name -> shell command, for every planned check of one module."""
    return {c.node or "": build(c) for c in plan.checks if c.module == module}


def firewalls(config: StackConfig, plan: Plan, nodes: dict[str, GpuNode]) -> dict[str, command.remote.Command]:
    """The host firewall (stacks/planner/firewall.py), one `<node>-firewall` command per node: applied atomically on
    create and update (a rules change is an update: never a replacement, whose delete would run after the new
    table is applied, stacks/planner/firewall.py FirewallCommand), removed on `pulumi destroy` (delete). Before
    it, after the node's preflight, `<node>-firewall-preflight` (the preflight's `firewall` section: nft present
    and usable, the kernel's ephemeral range inside the guarded one). Every engine container of the node waits
    for it. `firewall.enabled: false`: no resource (the plan warns)."""
    out: dict[str, command.remote.Command] = {}
    for name, fw in firewall_commands(config, plan.firewall).items():
        node = nodes[name]
        user = next(n.ssh.user for n in config.nodes if n.name == name)
        args = ["--name", f"firewall-preflight-{name}", *preflight_args(config)]
        check = heredoc_command("preflight", args, prefix="" if user == "root" else "sudo -n ",
                                timeout_s=outer_timeout_s(["firewall"]))
        preflight = command.remote.Command(
            f"{name}-firewall-preflight", connection=node.connection, create=check, triggers=[fw.ruleset_sha256, *args],
            opts=pulumi.ResourceOptions(parent=node, depends_on=[node.preflight]))
        out[name] = command.remote.Command(
            f"{name}-firewall", connection=node.connection, create=fw.create, update=fw.update, delete=fw.delete,
            opts=pulumi.ResourceOptions(parent=node, depends_on=[preflight], delete_before_replace=True))
    return out


def policy_facts(config: StackConfig, plan: Plan) -> PolicyFacts:
    """The planning facts the policy pack joins with the engine containers; a change restarts nothing."""
    from stacks.planner.network_rules import unguarded_monitor_hosts

    unguarded = [{"key": k, "address": a, "port": p} for k, a, p in unguarded_monitor_hosts(config)]
    return PolicyFacts("policy-facts", {
        "privateNetworks": list(config.fabric.private_networks),
        "estimatedLoadS": int(plan.model["estimated_load_s"]),
        **({"unguardedMonitors": unguarded} if unguarded else {}),
    })


def under_mocks() -> bool:
    """Is this program run by Pulumi's test mocks (`pulumi.runtime.set_mocks`) rather than by an engine?"""
    from pulumi.runtime.mocks import MockMonitor
    from pulumi.runtime.settings import get_monitor

    return isinstance(get_monitor(), MockMonitor)


@dataclass(frozen=True)
class EngineGroup:
    """One engine group's resources: its nodes, fabric, firewalls, weights checks, collectives and engines."""

    nodes: dict[str, GpuNode]
    fabric: RdmaFabric
    walls: dict[str, command.remote.Command]
    weights: pulumi.Output[dict[str, str | None]]
    weights_match: command.local.Command | None
    engine: VllmEngine
    collectives: dict[str, command.remote.Command]


BeforeContainers = Callable[[pulumi.Resource, dict[str, GpuNode]], Sequence[pulumi.Resource]]
"""Given the staged steps' last barrier and the group's nodes, what the containers must also wait for (a replica
group's drain, or the previous group's turn)."""


def engine_group(stack: str, config: StackConfig, plan: Plan, secrets: dict[str, pulumi.Output[Any]],
                 suffix: str = "", before: BeforeContainers | None = None) -> EngineGroup:
    """The nodes and the engine group of one plan. `suffix`: "" for a stack without groups (the resource names it
    always had), `-<group>` for a replica group's."""
    checks = {c.name: c for c in plan.checks}
    model_id = _digest(config.model.model_dump())
    nodes: dict[str, GpuNode] = {}
    fabric_args: dict[str, FabricNodeArgs] = {}
    for node in config.nodes:
        fabric_id = _digest([node.model_dump(), config.fabric.model_dump()])
        # The group generation too: a group restart (restart_epoch) or any launch change re-runs the preflights.
        triggers = [config.image.pull_ref, model_id, fabric_id, plan.head.containers[0].labels[GENERATION_LABEL]]
        nodes[node.name] = GpuNode(node.name, GpuNodeArgs(
            name=node.name, ssh_host=node.ssh.host, ssh_user=node.ssh.user, ssh_port=node.ssh.port,
            image=config.image.pull_ref,
            pre_pull_command=preflight_command(config, plan, checks[f"pre-pull-{node.name}"]),
            preflight_command=_in_model_dir(config, functools.partial(
                preflight_command, config, plan, checks[f"preflight-{node.name}"])), model_dir=config.model.host_path,
            preflight_triggers=triggers, ssh_private_key=secrets.get("ssh_private_key"),
            host_key=node.ssh.host_key, ssh_opts=docker_ssh_opts(stack, node),
            host_check_command=deepep_host_command(config, plan, checks[f"deepep-host-{node.name}"])
            if f"deepep-host-{node.name}" in checks else None,
            **weights_args(config, plan, checks[f"weights-{node.name}"], secrets)))
        fabric_check = checks.get(f"fabric-{node.name}")
        fabric_args[node.name] = FabricNodeArgs(
            node=nodes[node.name], env=node_env(config, node),
            preflight_command=preflight_command(config, plan, fabric_check) if fabric_check else None,
            triggers=[fabric_id, plan.head.containers[0].labels[GENERATION_LABEL]])
    fabric = RdmaFabric(f"fabric{suffix}", fabric_args)
    walls = firewalls(config, plan, nodes)
    weights, weights_match = weights_gate(plan, nodes, f"weights-match{suffix}")
    gates: dict[str, list[pulumi.Resource]] = {
        name: [node.preflight, *([fabric.preflights[name]] if name in fabric.preflights else []),
               *([walls[name]] if name in walls else []), *([weights_match] if weights_match else [])]
        for name, node in nodes.items()}
    collectives: dict[str, command.remote.Command] = {}

    def collective_gate(staged: pulumi.Resource) -> list[pulumi.Resource]:
        collectives.update(collective_commands(config, plan, nodes, staged))
        return [*collectives.values(), *(before(staged, nodes) if before is not None else [])]

    engine = VllmEngine(f"engine{suffix}", VllmEngineArgs(
        plan=plan, nodes=nodes, gates=gates, secrets=engine_secrets(plan, secrets),
        dry_run_commands=_model_dir_commands(config, plan, nodes, "checks.vllm_args", dry_run_command),
        ray_ready_command=ray_ready_command(config, plan) if "ray-cluster" in checks else None,
        page_cache_commands=_model_dir_commands(config, plan, nodes, "checks.page_cache", page_cache_command),
        model_dirs={n: node.model_dir for n, node in nodes.items()} if config.model.source else {},
        before_containers=collective_gate, was_ungrouped=bool(suffix)))
    return EngineGroup(nodes, fabric, walls, weights, weights_match, engine, collectives)


def _in_model_dir(config: StackConfig, build: Callable[[str], str]) -> str | Callable[[str], str]:
    """A command that reads the model directory: with `model.source` built from the version directory the node's
    sync reported (GpuNode.model_dir), else from `model.host_dir`/`model.path` now."""
    return build if config.model.source is not None else build(config.model.host_path)


def _model_dir_commands(config: StackConfig, plan: Plan, nodes: dict[str, GpuNode], module: str,
                        build: Callable[[StackConfig, Plan, CheckSpec, str | None], str]
                        ) -> dict[str, pulumi.Input[str]]:
    """Node -> a staged step's command that reads the model directory (dry run, page cache): with `model.source` the
    node's version directory, so the new revision is what is parsed and warmed while the old group serves."""
    if config.model.source is None:
        return dict(_node_commands(plan, module, lambda c: build(config, plan, c, None)))
    return {c.node or "": nodes[str(c.node)].model_dir.apply(functools.partial(build, config, plan, c))
            for c in plan.checks if c.module == module}


def weights_prunes(config: StackConfig, nodes: dict[str, GpuNode], after: Sequence[pulumi.Resource],
                   suffix: str = "") -> dict[str, command.remote.Command]:
    """With `model.source`, per node: remove old version directories once the group mounting the new one passed its
    checks (`after`); the command names the version in use, so it runs again exactly when that changes."""
    if config.model.source is None:
        return {}
    return {name: command.remote.Command(
        f"weights-prune-{name}{suffix}", connection=node.connection,
        create=node.model_dir.apply(functools.partial(weights_prune_command, config, name)),
        opts=pulumi.ResourceOptions(depends_on=list(after))) for name, node in nodes.items()}


def engine_secrets(plan: Plan, secrets: dict[str, pulumi.Output[Any]]) -> dict[str, pulumi.Output[Any]]:
    """The secret values the plan's containers read (`secret_env`), by config key."""
    return {ref: secrets[ref] for node in plan.nodes for c in node.containers for ref in c.secret_env.values()}


def build(stack: str, config: StackConfig, plan: Plan, secrets: dict[str, pulumi.Output[Any]]) -> dict[str, Any]:
    # Before any Docker provider connects: the pinned host keys its ssh reads (components/ssh_trust.py). Not under
    # Pulumi's mocks: no provider connects there, and a test's stack would overwrite the real deploy's file.
    if not under_mocks():
        write_known_hosts(stack, config)
    facts = policy_facts(config, plan)
    group = engine_group(stack, config, plan, secrets)
    nodes, fabric, walls, engine = group.nodes, group.fabric, group.walls, group.engine
    weights, weights_match, collectives = group.weights, group.weights_match, group.collectives
    smoke = [s for s in api_sections(plan) if s != "health"]
    api_settings = _digest(config.api.model_dump(exclude={"watch_interval_s"}))
    client = check_client(config)
    check_key = secrets["proxy_keys"].apply(lambda keys: str(keys[client])) if client else secrets.get("api_key")
    on_head = api_on_head(config)
    api = ApiEndpoint("api", ApiEndpointArgs(
        endpoint=plan.endpoint, served_model=config.model.served_name,
        health_command=api_command(config, plan, ["health"], "api-health"),
        smoke_command=api_command(config, plan, smoke, "api-smoke"),
        triggers=[*engine.check_triggers, api_settings], after=engine.ready, api_key=None if on_head else check_key,
        tls_ca=secrets.get("tls_certificate") if plan.proxy and plan.proxy.tls else None,
        proxy=_proxy_args(config, nodes[config.head.name], secrets) if plan.proxy else None,
        connection=nodes[config.head.name].connection if on_head else None,
        node_checks={_node_check_key(c): (nodes[str(c.node)].connection, node_api_command(config, plan, c))
                     for c in plan.checks if c.name.startswith("api-node-") or server_rank(c) is not None}))
    engine.verify_engines(_node_commands(plan, "checks.engines", lambda c: engines_command(plan, c)),
                          after=[api.health])
    fabric.verify_transport(_node_commands(plan, "checks.nccl_transport", lambda c: nccl_command(config, plan, c)),
                            after=[api.health], triggers=list(engine.check_triggers))
    prunes = weights_prunes(config, nodes, [api.health, api.smoke, *engine.readiness.values()])
    monitoring = observability(stack, config, plan, nodes, engine, secrets)
    outputs: dict[str, Any] = {
        "endpoint": api.endpoint,
        "image": config.image.pull_ref,
        "topology": {k: plan.topology[k] for k in ("backend", "nodes", "tensor", "pipeline", "data", "expert")},
        "nodes": roles(plan),
        "served_model": api.served_model,
        "verification": api.verification,
        "weights": weights,
    }
    if plan.observability is not None:
        outputs["monitoring"] = {"prometheus": plan.observability.prometheus, "grafana": plan.observability.grafana}
    for key, value in outputs.items():
        pulumi.export(key, value)
    return {"outputs": outputs, "nodes": nodes, "fabric": fabric, "engine": engine, "api": api, "facts": facts,
            "firewalls": walls, "weights_match": weights_match, "collectives": collectives,
            "observability": monitoring, "weights_prunes": prunes}


def _node_check_key(check: CheckSpec) -> str:
    """The name an on-node API check's resource carries (`api-<key>-api`): the node for `api-node-<node>` (hybrid,
    one per node), `<node>-rank-<r>` for `api-server-rank-<r>` (external, one per DP rank)."""
    rank = server_rank(check)
    return str(check.node) if rank is None else f"{check.node}-rank-{rank}"


def observability(stack: str, config: StackConfig, plan: Plan, nodes: dict[str, GpuNode], engine: VllmEngine,
                  secrets: dict[str, pulumi.Output[Any]]) -> Observability | None:
    """The monitoring containers (docs/observability.md). Files come from the same generator as `python -m stacks
    observability`; alertmanager.yml is rendered inside an apply, since it holds the webhook URL (a secret)."""
    if plan.observability is None:
        return None
    from stacks.planner.observability import alertmanager_config, grafana_env, render_files
    from stacks.planner.topology import derive_topology

    topo, _ = derive_topology(config)
    files = render_files(stack, config, topo, {n.name: n.containers for n in plan.nodes})
    files.pop("alertmanager.yml", None)
    webhook = secrets.get("alert_webhook_url")
    conf = None
    if webhook is not None:
        import yaml

        conf = webhook.apply(lambda url: yaml.safe_dump(alertmanager_config(stack, str(url)), sort_keys=False))
    return Observability("observability", ObservabilityArgs(
        plan=plan.observability, stack=stack, files=files, providers={n: g.provider for n, g in nodes.items()},
        data_dir=config.observability.data_dir, grafana_env=grafana_env(config),
        admin_password=secrets["grafana_admin_password"], alertmanager_conf=conf,
        engines=dict(engine.node_containers), connections={n: g.connection for n, g in nodes.items()}))



# ---- weights: per-node sync or verify, and the cross-node comparison (docs/weights.md) ---------


def weights_args(config: StackConfig, plan: Plan, check: CheckSpec,
                 secrets: dict[str, pulumi.Output[Any]]) -> dict[str, Any]:
    """GpuNodeArgs' weights fields. Re-run when the source settings, the directory or the image change (an in-sync
    run only lists and compares, but a run on every update would make every preview show the weights and
    everything after them as changing). Credentials go to the command's stdin, built inside an apply over the
    secret Outputs: never in the command text, which is argv of the node's shell and plain in the state."""
    source = config.model.source
    # keep_versions only changes what the prune after the checks keeps: not a reason to sync again
    settings = _digest([source.model_dump(exclude={"keep_versions"}) if source else None, config.model.host_path])
    stdin: pulumi.Output[str] | None = None
    if source is not None and "s3_access_key_id" in secrets and "s3_secret_access_key" in secrets:
        parts = [secrets["s3_access_key_id"], secrets["s3_secret_access_key"]]
        parts += [secrets["s3_session_token"]] if "s3_session_token" in secrets else []
        stdin = pulumi.Output.secret(pulumi.Output.all(*parts).apply(_credential_lines))
    return {"weights_command": weights_command(config, plan, check),
            "weights_triggers": [settings, config.image.pull_ref],
            "weights_in_image": source is not None, "weights_stdin": stdin}


def _credential_lines(values: list[Any]) -> str:
    try:
        return credentials_stdin(str(values[0]), str(values[1]), str(values[2]) if len(values) > 2 else None)
    except ValueError as exc:  # names the variable, never the value
        raise pulumi.RunError(f"s3_* secrets: {exc}; set each with pulumi config set --secret") from None


def weights_gate(plan: Plan, nodes: dict[str, GpuNode], name: str = "weights-match"
                 ) -> tuple[pulumi.Output[dict[str, str | None]], command.local.Command | None]:
    """Every node's weights hash (the stack output `weights`), and with more than one node the comparison that every
    engine waits for: a node holding other weights fails the update, named with both hashes, before anything
    moves. The hashes are read from the verdicts the nodes printed (`checks.weights_node.weights_hash`): each node's
    content-sha256 (its commands run with `--content`), so a shard changed in place with its size kept differs."""
    names = list(nodes)
    hashes: pulumi.Output[dict[str, str | None]] = pulumi.Output.all(
        *[nodes[n].weights.stdout for n in names]).apply(
            lambda outs: {n: weights_hash(str(o or "")) for n, o in zip(names, outs, strict=True)})
    if not any(c.name == "weights-match" for c in plan.checks):
        return hashes, None
    create = hashes.apply(weights_match_command)
    match = command.local.Command(name, create=create, triggers=[create],
                                  opts=pulumi.ResourceOptions(depends_on=[n.weights for n in nodes.values()]))
    return hashes, match


# ---- the collective check, after every dry run and before any engine container -------------------------------


def collective_commands(config: StackConfig, plan: Plan, nodes: dict[str, GpuNode],
                        dry_runs: pulumi.Resource) -> dict[str, command.remote.Command]:
    """One `collective-<node>` per node. Each waits for every node's dry run through their barrier (an image
    that cannot even parse its argv never gets to stop an engine) and re-runs when the image, any node's fabric
    env or arguments, or the floor changes: a node alone cannot all-reduce, so the triggers are the whole
    group's. The commands have no dependency on each other, so Pulumi starts them together (within --parallel).
    Their text carries no generation: a launch change that replaces the group without touching the image or the
    fabric does not re-run them."""
    checks = [c for c in plan.checks if c.module == "checks.collective"]
    if not checks:
        return {}
    floor, _ = min_busbw_gbps(config)
    runs = collective_runs(config, plan, min_busbw_gbps=floor, master_port=config.fabric.collective_port)
    group = _digest([[r.node, r.env, r.args] for r in runs])  # every node's fabric env and arguments
    triggers = [config.image.pull_ref, group, f"min_busbw_gbps={floor:g}"]
    return {
        str(c.node): command.remote.Command(
            c.name, connection=nodes[str(c.node)].connection, create=collective_command(config, plan, c, runs),
            triggers=triggers, opts=pulumi.ResourceOptions(depends_on=[dry_runs]))
        for c in checks
    }


# ---- replica groups: one engine group per group, rolled one at a time behind the front door (docs/rolling.md) ----


def build_groups(stack: str, config: StackConfig, whole: StackPlan, secrets: dict[str, pulumi.Output[Any]]
                 ) -> dict[str, Any]:
    """Every group's nodes and engines (`engine_group`, names suffixed `-<group>`), then the front door and its
    checks. The groups take their turns in order: a group's containers wait for the previous group's turn to end,
    and where the change can roll (`whole.rolling`) each turn is drain (stacks/planner/rolling.py, on the front door
    host) -> replace -> the group's own check (`check-<group>`, on its head against its own vLLM) -> undrain. Each
    drain and undrain carries the group's generation and secrets digest as triggers, so it runs exactly when the
    group is replaced; the staged steps (pull, dry run, page cache) of every group run before any turn."""
    if not under_mocks():
        write_known_hosts(stack, config)
    facts = PolicyFacts("policy-facts", {
        "privateNetworks": list(config.fabric.private_networks),
        "estimatedLoadS": max(int(g.plan.model["estimated_load_s"]) for g in whole.groups),
    })
    front = whole.groups[0]
    peers = {p.group: p for p in (front.context.peers if front.context else ())}
    head = config.head.name
    sudo = "" if config.head.ssh.user == "root" else "sudo -n "
    parts: dict[str, EngineGroup] = {}
    turns: dict[str, dict[str, command.remote.Command]] = {}
    previous: list[pulumi.Resource] = []
    for gp in whole.groups:
        name = str(gp.name)
        sub, plan = gp.config, gp.plan
        servers = ([(local_api_host(sub), sub.serving.port)] if gp is front
                   else [(peers[name].host, peers[name].port)] if name in peers else [])
        triggers: list[pulumi.Input[str]] = [plan.head.containers[0].labels[GENERATION_LABEL],
                                             secrets_trigger(engine_secrets(plan, secrets))]
        turn: dict[str, command.remote.Command] = {}
        waits = list(previous)

        def drain(staged: pulumi.Resource, nodes: dict[str, GpuNode], name: str = name, sub: StackConfig = sub,
                  servers: list[tuple[str, int]] = servers, triggers: list[pulumi.Input[str]] = triggers,
                  turn: dict[str, command.remote.Command] = turn, waits: list[pulumi.Resource] = waits
                  ) -> list[pulumi.Resource]:
            if not whole.rolling.can_roll or not servers:
                return waits
            door = (parts[str(front.name)].nodes if str(front.name) in parts else nodes)[head]
            if sub.model.source is not None:  # a new revision replaces the group: drain it first
                triggers.append(weights_trigger({n: node.model_dir for n, node in nodes.items()}))
            turn["drain"] = command.remote.Command(
                f"drain-{name}", connection=door.connection, triggers=triggers,
                create=f"{sudo}sh -c {shlex.quote(drain_script(name, servers))}",
                opts=pulumi.ResourceOptions(depends_on=[staged, *waits]))
            return [turn["drain"]]

        part = engine_group(stack, sub, plan, secrets, f"-{name}", drain)
        parts[name] = part
        sections = [s for s in api_sections(plan) if s != "deny"]
        turn["check"] = command.remote.Command(
            f"check-{name}", connection=part.nodes[plan.head.name].connection,
            triggers=list(part.engine.check_triggers),
            create=api_command(sub, plan, sections, f"check-{name}", group_direct=True),
            opts=pulumi.ResourceOptions(depends_on=part.engine.ready))
        engines = {c.node or "": engines_command(plan, c) for c in plan.checks if c.module == "checks.engines"}
        part.engine.verify_engines(engines, after=[turn["check"]])
        nccl = {c.node or "": nccl_command(sub, plan, c) for c in plan.checks if c.module == "checks.nccl_transport"}
        part.fabric.verify_transport(nccl, after=[turn["check"]], triggers=list(part.engine.check_triggers))
        if "drain" in turn:
            turn["undrain"] = command.remote.Command(
                f"undrain-{name}", connection=parts[str(front.name)].nodes[head].connection, triggers=triggers,
                create=f"{sudo}sh -c {shlex.quote(undrain_script(name, servers))}",
                opts=pulumi.ResourceOptions(depends_on=[turn["check"], *part.engine.readiness.values()]))
        turn.update({f"prune-{n}": c for n, c in weights_prunes(
            sub, part.nodes, [turn["check"], *part.engine.readiness.values()], f"-{name}").items()})
        turns[name] = turn
        previous = [turn.get("undrain", turn["check"])]
    router = None
    router_spec = whole.router_container_spec()
    if whole.router is not None and router_spec is not None:  # prefill/decode: the router, its check, then the door
        router = pd_router(config, whole.router, router_spec, parts[str(front.name)].nodes[head], secrets,
                           [t for p in parts.values() for t in p.engine.check_triggers], previous)
        previous = [router.check]
    api = front_door_endpoint(config, whole, parts, secrets, previous)
    weights = pulumi.Output.all(*[p.weights for p in parts.values()]).apply(
        lambda maps: {k: v for m in maps for k, v in m.items()})
    outputs: dict[str, Any] = {
        "endpoint": api.endpoint,
        "image": config.image.pull_ref,
        "groups": {str(g.name): {"nodes": [n.name for n in g.plan.nodes],
                                 "role": g.role,
                                 "topology": {k: g.plan.topology[k] for k in ("backend", "nodes", "tensor", "pipeline",
                                                                              "data", "expert")}}
                   for g in whole.groups},
        "rolling": whole.rolling.as_dict(),
        **({"router": router.container.name} if router is not None else {}),
        "nodes": {k: v for g in whole.groups for k, v in roles(g.plan).items()},
        "served_model": api.served_model,
        "verification": api.verification,
        "weights": weights,
    }
    for key, value in outputs.items():
        pulumi.export(key, value)
    return {"outputs": outputs, "groups": parts, "turns": turns, "api": api, "facts": facts, "router": router}


def front_door_endpoint(config: StackConfig, whole: StackPlan, parts: dict[str, EngineGroup],
                        secrets: dict[str, pulumi.Output[Any]], after: list[pulumi.Resource]) -> ApiEndpoint:
    """The stack's endpoint: the front door (on the first group's head, spread over every group) and the API checks
    through it, after every group's turn. No DP rank is pinned: nginx picks the group."""
    front = whole.groups[0]
    sub, plan = front.config, front.plan
    head = parts[str(front.name)].nodes[config.head.name]
    smoke = [s for s in api_sections(plan) if s != "health"]
    client = check_client(sub)
    check_key = secrets["proxy_keys"].apply(lambda keys: str(keys[client])) if client else secrets.get("api_key")
    on_head = api_on_head(sub)
    return ApiEndpoint("api", ApiEndpointArgs(
        endpoint=plan.endpoint, served_model=config.model.served_name,
        health_command=api_command(sub, plan, ["health"], "api-health", pin_ranks=False),
        smoke_command=api_command(sub, plan, smoke, "api-smoke", pin_ranks=False),
        triggers=[*(t for p in parts.values() for t in p.engine.check_triggers),
                  _digest(config.api.model_dump(exclude={"watch_interval_s"}))],
        after=after, api_key=None if on_head else check_key,
        tls_ca=secrets.get("tls_certificate") if plan.proxy and plan.proxy.tls else None,
        proxy=_proxy_args(sub, head, secrets, front.context) if plan.proxy else None,
        connection=head.connection if on_head else None))

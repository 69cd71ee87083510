"""VllmEngine: the whole engine group — one container per node exactly as the plan lists it, in start order.

vLLM is fail-stop: a lone restarted rank hangs against stale peers. Every container carries the group's
`generation` label (a hash of the inputs that replace a container, stacks/planner/launch.py GENERATION_FIELDS), so a
change that replaces one node's container replaces every node's; the secret values the group uses (which no
label may carry) move every container through the `secrets-generation` label instead (`secrets_holder`).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_command as command
import pulumi_docker as docker

from components.barrier import barrier
from components.gpu_node import GpuNode
from stacks.planner.container_spec import GENERATION_LABEL, SECRETS_LABEL, ContainerSpec, is_versioned
from stacks.planner.launch import ENGINE_REPLACE_ON_CHANGES
from stacks.planner.plan import Plan

VLLM_ENGINE_TYPE = "vllm-cluster:index:VllmEngine"
REPLACE_ON_CHANGES = list(ENGINE_REPLACE_ON_CHANGES)
"""Replace, never update, on these (review/replacement.py says why; the replacement matrix uses the same list)."""


def secrets_trigger(secrets: Mapping[str, pulumi.Input[str]]) -> pulumi.Output[str]:
    """A secret digest of every secret value the group's containers use (sorted by config key): rotating
    `api_key` changes only the head's env, and must still replace the whole group; the checks carry it as a
    trigger so that they run again then. Stored in state as a secret, like the env itself."""
    refs = sorted(secrets)

    def digest(values: list[Any]) -> str:
        return hashlib.sha256(json.dumps(dict(zip(refs, values, strict=True)), sort_keys=True).encode()).hexdigest()

    return pulumi.Output.secret(pulumi.Output.all(*[secrets[r] for r in refs]).apply(digest))


def secrets_holder(name: str, digest: pulumi.Input[str], parent: pulumi.Resource) -> command.local.Command:
    """A resource replaced exactly when `digest` changes (a secret `triggers` input: pulumi-command replaces on a
    change), and so given a new ID then (pulumi-command's Create: `resource.NewUniqueHex`, random). Every engine
    container carries that ID in its `secrets-generation` label (SECRETS_LABEL), which replaces it: a rotated
    secret replaces the whole group, and a rotation cut short (the head replaced, a peer not) is finished by the
    next `pulumi up`, because each container's own state holds the ID it was made with.

    Not a secret `replacement_trigger` on the containers: the real CLI's `pulumi preview --json` (v3.277.0) panics
    on one ("attempt to encrypt value", pkg/backend/display/json.go `stateForJSONOutput`), and a plain digest of
    the secrets would sit unencrypted in the state. Not `replace_with` the holder either: Pulumi replaces those
    only in the run that replaces the holder, so a run cut short left the group split (seen on the lab). Its
    command prints a fixed line, never the digest."""
    return command.local.Command(
        name, create=f"echo {shlex.quote(f'{name}: the engine group secrets are in place')}", triggers=[digest],
        opts=pulumi.ResourceOptions(parent=parent))


@dataclass(frozen=True)
class VllmEngineArgs:
    plan: Plan
    nodes: Mapping[str, GpuNode]
    gates: Mapping[str, Sequence[pulumi.Resource]]
    """Per node, the preflights that must pass before any container is touched."""
    secrets: Mapping[str, pulumi.Input[str]]
    """Secret config key (`api_key`, `env_secrets.HF_TOKEN`) -> its value, for the plan's `secret_env`."""
    dry_run_commands: Mapping[str, pulumi.Input[str]]
    """Per node: the new image's vLLM parses the node's argv. Every one must pass before any container moves."""
    ray_ready_command: str | None = None
    page_cache_commands: Mapping[str, pulumi.Input[str]] = field(default_factory=dict)
    """Per node: read the shards its ranks will load into the page cache, after every dry run passed and before
    any container moves (checks/page_cache.py)."""
    before_containers: Callable[[pulumi.Resource], Sequence[pulumi.Resource]] | None = None
    """Given the barrier that stands for every dry run, what must pass after all of them and before any container
    moves (the collective check); the containers then wait for a barrier over these instead."""
    model_dirs: Mapping[str, pulumi.Input[str]] = field(default_factory=dict)
    """With `model.source`, per node: the version directory its sync reported (`GpuNode.model_dir`), mounted where
    the plan writes `<host_dir>/<path>@<version>`. A new revision changes it, which replaces every container (the
    same version on every node: `weights-match` compares them first) and re-runs the checks (`check_triggers`)."""
    was_ungrouped: bool = False
    """A replica group's engine (components/program.py `build_groups`): each container is aliased to the name it
    had when the stack was one engine group (`engine-<node>-<container>` under `engine`), so splitting a stack into
    groups replaces each container in place (deleted first) instead of creating a second one of the same Docker
    name beside it."""


def weights_trigger(model_dirs: Mapping[str, pulumi.Input[str]]) -> pulumi.Output[str]:
    """`weights=<version directories>`: what a step that must run again for a new revision of the weights carries
    as a trigger (the group's checks, a replica group's drain and undrain)."""
    nodes = sorted(model_dirs)
    return pulumi.Output.all(*[model_dirs[n] for n in nodes]).apply(
        lambda dirs: "weights=" + ",".join(sorted(set(map(str, dirs)))))


def _secret_env(key: str, value: pulumi.Input[str]) -> pulumi.Output[str]:
    return pulumi.Output.concat(key, "=", pulumi.Output.secret(value))


def go_duration(seconds: int) -> str:
    """`seconds` as Go's `time.Duration.String()` writes it (600 -> "10m0s"): the docker provider reads a container's
    healthcheck durations back that way (terraform-provider-docker `flattenContainerHealthcheck`), and the
    healthcheck forces a replacement, so "600s" would replace the container on every `pulumi up` (found on the lab
    with the real provider)."""
    hours, rest = divmod(int(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def container_args(spec: ContainerSpec, image_id: pulumi.Input[str], secrets: Mapping[str, pulumi.Input[str]],
                   secrets_generation: pulumi.Input[str], model_dir: pulumi.Input[str] | None = None
                   ) -> docker.ContainerArgs:
    """The plan's container spec, field by field, as pulumi-docker arguments; `model_dir` fills in the planned
    model version directory (`<host_dir>/<path>@<version>`)."""
    def host(planned: str) -> pulumi.Input[str]:
        if is_versioned(planned):
            if model_dir is None:
                raise ValueError(f"{spec.name}: the plan mounts a model version directory and no sync reported one")
            return model_dir
        return planned

    envs: list[pulumi.Input[str]] = [f"{key}={value}" for key, value in spec.env.items()]
    envs += [_secret_env(key, secrets[ref]) for key, ref in spec.secret_env.items()]
    health = spec.healthcheck
    return docker.ContainerArgs(
        name=spec.name,
        image=image_id,
        command=list(spec.command),
        entrypoints=list(spec.entrypoint) if spec.entrypoint is not None else None,
        envs=envs,
        network_mode=spec.network_mode,
        ipc_mode=spec.ipc_mode,
        privileged=spec.privileged,
        gpus=spec.gpus,
        ulimits=[docker.ContainerUlimitArgs(name=k, soft=v[0], hard=v[1]) for k, v in spec.ulimits.items()],
        shm_size=spec.shm_size_mb,
        volumes=[docker.ContainerVolumeArgs(host_path=host(v.host), container_path=v.container, read_only=v.read_only)
                 for v in spec.volumes],
        devices=[docker.ContainerDeviceArgs(host_path=d, container_path=d) for d in spec.devices],
        capabilities=docker.ContainerCapabilitiesArgs(adds=list(spec.capabilities)) if spec.capabilities else None,
        restart=spec.restart,
        labels=[*(docker.ContainerLabelArgs(label=k, value=v) for k, v in spec.labels.items()),
                docker.ContainerLabelArgs(label=SECRETS_LABEL, value=secrets_generation)],
        healthcheck=docker.ContainerHealthcheckArgs(
            tests=list(health.test), interval=go_duration(health.interval_s), timeout=go_duration(health.timeout_s),
            retries=health.retries, start_period=go_duration(health.start_period_s)) if health else None,
        must_run=True,
        wait=False,
        logs=False,
    )


class VllmEngine(pulumi.ComponentResource):
    containers: dict[str, docker.Container]
    ray_ready: command.remote.Command | None
    readiness: dict[str, command.remote.Command]

    def __init__(self, name: str, args: VllmEngineArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(VLLM_ENGINE_TYPE, name, None, opts)
        plan = args.plan
        self._prefix = name
        self._args = args
        self.generation = plan.head.containers[0].labels[GENERATION_LABEL]
        self.secrets_digest = secrets_trigger(args.secrets)
        self.secrets_holder = secrets_holder(f"{name}-secrets", self.secrets_digest, self)
        self.check_triggers: list[pulumi.Input[str]] = [self.generation, self.secrets_digest]
        if args.model_dirs:  # a new revision of the weights replaces the group without changing its generation
            self.check_triggers.append(weights_trigger(args.model_dirs))
        """What every check of the running group carries as triggers: whatever replaces the group re-runs them."""
        ready_s = int(plan.head.containers[0].env.get("VLLM_ENGINE_READY_TIMEOUT_S", "3600"))
        timeouts = pulumi.CustomTimeouts(create=f"{ready_s + 600}s", update=f"{ready_s + 600}s", delete="600s")
        # Rollout order: every node's image is pulled (GpuNode) and preflighted (gates), then the new image's
        # vLLM parses each node's argv, then every node warms its page cache; only then is any container touched.
        # A failure here leaves the old group serving.
        # Every step that must finish on all nodes fans in through one barrier (components/barrier.py), so the
        # graph grows with N, not N^2; dependencies are transitive.
        self.images = barrier(f"{name}-gate-images", [node.image for node in args.nodes.values()], parent=self)
        self.dry_runs: dict[str, command.remote.Command] = {
            node_name: command.remote.Command(
                f"{name}-{node_name}-args-dry-run", connection=args.nodes[node_name].connection, create=check,
                triggers=list(self.check_triggers),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[self.images, *args.gates.get(node_name, [])]))
            for node_name, check in args.dry_run_commands.items()
        }
        self.gates: list[command.local.Command] = [barrier(
            f"{name}-gate-dry-runs", [*self.dry_runs.values()] or [
                self.images, *(g for node_gates in args.gates.values() for g in node_gates)], parent=self)]
        """The barriers in rollout order; the containers wait for the last one."""
        # The staged change's last step: every node warms its page cache while the old group still serves. A failure
        # stops the update here, like a failed dry run; a node that cannot hold it all warms what fits and says so.
        self.page_cache: dict[str, command.remote.Command] = {
            node_name: command.remote.Command(
                f"{name}-{node_name}-page-cache", connection=args.nodes[node_name].connection, create=warm,
                triggers=list(self.check_triggers),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[self.gates[-1]]))
            for node_name, warm in args.page_cache_commands.items()
        }
        if self.page_cache:
            self.gates.append(barrier(f"{name}-gate-page-cache", list(self.page_cache.values()), parent=self))
        checks = args.before_containers(self.gates[-1]) if args.before_containers is not None else []
        if checks:
            self.gates.append(barrier(f"{name}-gate-collectives", checks, parent=self))
        gates: list[pulumi.Resource] = [self.gates[-1]]
        self.containers = {}
        """Node name -> its engine container; with several on a node (external load balancing), `node/container`."""
        self.node_containers: dict[str, list[docker.Container]] = {}
        started: list[pulumi.Resource] = []
        for node_name in plan.start_order:
            node_plan = plan.node(node_name)
            node = args.nodes[node_name]
            is_head = node_name == plan.head.name
            # mp: every other node first, head last: they only dial the head and retry (DP RPC handshake, also with
            # hybrid load balancing, whose nodes run their own API servers; the TCPStore on --master-port when a
            # replica spans nodes), the head's waits start once it runs.
            # ray: head first, workers after.
            # External load balancing: a container per DP rank, in the plan's order; on the head each waits for
            # the one before it, so rank 0 (last: it hosts the handshake every rank dials) starts after all.
            for spec in node_plan.containers:
                if plan.topology["backend"] == "mp":
                    after = [*gates, *(started if is_head else [])]
                else:
                    after = [*gates, *([] if is_head else started[:1])]
                key = node_name if len(node_plan.containers) == 1 else f"{node_name}/{spec.name}"
                aliases = [pulumi.Alias(name=f"engine-{node_name}-{spec.name}",
                                        parent=pulumi.resource.create_urn("engine", VLLM_ENGINE_TYPE))
                           ] if args.was_ungrouped else None
                self.containers[key] = docker.Container(
                    f"{name}-{node_name}-{spec.name}",
                    args=container_args(spec, node.image.image_id, args.secrets, self.secrets_holder.id,
                                        args.model_dirs.get(node_name)),
                    opts=pulumi.ResourceOptions(
                        parent=self, provider=node.provider, depends_on=after, delete_before_replace=True,
                        replace_on_changes=REPLACE_ON_CHANGES, aliases=aliases,
                        custom_timeouts=timeouts))
                self.node_containers.setdefault(node_name, []).append(self.containers[key])
                started.append(self.containers[key])
        self.ray_ready = None
        if args.ray_ready_command is not None:
            head = args.nodes[plan.head.name]
            self.ray_ready = command.remote.Command(
                f"{name}-ray-cluster-ready", connection=head.connection, create=args.ray_ready_command,
                triggers=list(self.check_triggers),
                opts=pulumi.ResourceOptions(parent=self, depends_on=list(self.containers.values())))
        self.readiness = {}

    @property
    def ready(self) -> list[pulumi.Resource]:
        """What an API check waits for: every container, and Ray's cluster-ready check where there is one."""
        return [*self.containers.values(), *([self.ray_ready] if self.ray_ready else [])]

    def verify_engines(self, commands: Mapping[str, str], after: Sequence[pulumi.Resource]) -> None:
        """Every DP engine joined (after /health is 200); then the component's outputs are final."""
        for node_name, check in commands.items():
            self.readiness[node_name] = command.remote.Command(
                f"{self._prefix}-{node_name}-dp-engines", connection=self._args.nodes[node_name].connection,
                create=check, triggers=list(self.check_triggers),
                opts=pulumi.ResourceOptions(parent=self, depends_on=list(after)))
        self.register_outputs({
            "generation": self.generation,
            "containers": {n: c.id for n, c in self.containers.items()},
        })

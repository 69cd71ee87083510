"""GpuNode: one GPU host — its Docker provider over SSH, the model weights, the host preflight and the engine image.

Order on each node (docs/deploy.md), so a node that cannot take the engine fails before ~20 GB are pulled and
before any engine moves:

- without `model.source`: weights (the completeness check, on the node's python3) -> pre-pull preflight
  (ownership, disk, gpu, model) and, with a DeepEP all-to-all backend over nodes, the DeepEP host check ->
  `RemoteImage` -> preflight (toolkit, memlock);
- with `model.source`: pre-pull preflight (ownership, disk, gpu) and the DeepEP host check -> `RemoteImage` ->
  weights (the sync, inside the image just pulled: nodes are assumed to have Docker and the stack's images,
  nothing else, and boto3 ships in vllm/vllm-openai) -> preflight (model, toolkit, memlock; `model` reads the
  files the sync wrote).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pulumi
import pulumi_command as command
import pulumi_docker as docker

from checks.weights_node import weights_version_dir
from components.ssh_trust import BASE_SSH_OPTS
from stacks.model.field_types import host_port

SSH_OPTS = BASE_SSH_OPTS
"""Without a host key; `components.ssh_trust.docker_ssh_opts` adds the pinning options when the node has one."""


@dataclass(frozen=True)
class GpuNodeArgs:
    name: str
    ssh_host: str
    ssh_user: str
    ssh_port: int
    image: str
    """`repo:tag` or `repo:tag@sha256:…`: a digest pins what is pulled."""
    pre_pull_command: str
    """Host preflight sections that need no image (`checks.preflight.BEFORE_PULL`, less `model` with a source)."""
    preflight_command: str | Callable[[str], str]
    """Host preflight sections after the pull (`AFTER_PULL`, plus `model` with a source). A callable is given the
    model directory the weights step reported (`model_dir`), for the `model` section to read."""
    preflight_triggers: list[str]
    """Image, model and fabric identity: a change to any re-runs both preflights."""
    weights_command: str
    weights_triggers: list[str]
    """The weights settings and the image: a change re-runs the sync or the verify."""
    weights_in_image: bool = False
    """True with `model.source`: the sync runs in the image, so it comes after the pull."""
    weights_stdin: pulumi.Input[str] | None = None
    """`NAME=VALUE` credential lines (a secret Output); never in the command text."""
    ssh_private_key: pulumi.Input[str] | None = None
    host_key: str | None = None
    """`nodes[].ssh.host_key`: the only key the check commands accept (pulumi-command `host_key`)."""
    ssh_opts: list[str] | None = None
    """The Docker provider's ssh options (`components.ssh_trust.docker_ssh_opts`: pinned to the host key)."""
    host_check_command: str | None = None
    """`checks.deepep_host` where the all-to-all backend needs NVSHMEM on the hosts: the image pull waits for it."""
    model_dir: str = ""
    """`model.host_dir`/`model.path`: where the weights are, or, with a source, where version directories go beside
    (and the fallback for a sync that named none: a state written before versions)."""


class GpuNode(pulumi.ComponentResource):
    provider: docker.Provider
    image: docker.RemoteImage
    connection: command.remote.ConnectionArgs
    weights: command.remote.Command
    pre_pull: command.remote.Command
    preflight: command.remote.Command
    host_check: command.remote.Command | None
    model_dir: pulumi.Output[str]
    """The directory the engines mount and the checks read: the version directory a sync reported, else
    `args.model_dir`."""

    def __init__(self, name: str, args: GpuNodeArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("vllm-cluster:index:GpuNode", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.provider = docker.Provider(
            f"{name}-docker", host=f"ssh://{args.ssh_user}@{host_port(args.ssh_host, args.ssh_port)}",
            ssh_opts=list(args.ssh_opts if args.ssh_opts is not None else SSH_OPTS), opts=child)
        self.connection = command.remote.ConnectionArgs(
            host=args.ssh_host, user=args.ssh_user, port=args.ssh_port, private_key=args.ssh_private_key,
            host_key=args.host_key)
        weights_first = not args.weights_in_image
        if weights_first:
            self.weights = self._weights(name, args, [])
        self.pre_pull = command.remote.Command(
            f"{name}-pre-pull", connection=self.connection, create=args.pre_pull_command,
            triggers=list(args.preflight_triggers),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.weights] if weights_first else []))
        self.host_check = None
        if args.host_check_command is not None:
            self.host_check = command.remote.Command(
                f"{name}-deepep-host", connection=self.connection, create=args.host_check_command,
                triggers=list(args.preflight_triggers),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[self.weights] if weights_first else []))
        # keep_locally: a rollback to this image must not re-pull ~20 GB, and `pulumi destroy` keeps it too.
        self.image = docker.RemoteImage(
            f"{name}-image", name=args.image, keep_locally=True,
            opts=pulumi.ResourceOptions(parent=self, provider=self.provider, depends_on=[
                self.pre_pull, *([self.host_check] if self.host_check is not None else [])]))
        if not weights_first:
            self.weights = self._weights(name, args, [self.image])
        fallback = args.model_dir
        self.model_dir = (self.weights.stdout.apply(lambda out: weights_version_dir(str(out or "")) or fallback)
                          if args.weights_in_image else pulumi.Output.from_input(fallback))
        preflight = args.preflight_command
        self.preflight = command.remote.Command(
            f"{name}-preflight", connection=self.connection,
            create=preflight if isinstance(preflight, str) else self.model_dir.apply(preflight),
            triggers=list(args.preflight_triggers),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.image, self.weights]))
        self.register_outputs({"image_id": self.image.image_id, "preflight": self.preflight.stdout,
                               "weights": self.weights.stdout})

    def _weights(self, name: str, args: GpuNodeArgs, after: list[pulumi.Resource]) -> command.remote.Command:
        stdin = pulumi.Output.secret(args.weights_stdin) if args.weights_stdin is not None else None
        return command.remote.Command(
            f"{name}-weights", connection=self.connection, create=args.weights_command, stdin=stdin,
            triggers=list(args.weights_triggers), opts=pulumi.ResourceOptions(parent=self, depends_on=after))

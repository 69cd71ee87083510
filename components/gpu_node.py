"""GpuNode: one GPU host — its Docker provider over SSH, the engine image, and the host preflight."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_command as command
import pulumi_docker as docker

from stacks.ssh_trust import BASE_SSH_OPTS

SSH_OPTS = BASE_SSH_OPTS
"""Without a host key; `stacks.ssh_trust.docker_ssh_opts` adds the pinning options when the node has one."""


@dataclass(frozen=True)
class GpuNodeArgs:
    name: str
    ssh_host: str
    ssh_user: str
    ssh_port: int
    image: str
    """`repo:tag` or `repo:tag@sha256:…`: a digest pins what is pulled."""
    preflight_command: str
    preflight_triggers: list[str]
    """Image, model and fabric identity: a change to any re-runs the preflight."""
    ssh_private_key: pulumi.Input[str] | None = None
    host_key: str | None = None
    """`nodes[].ssh.host_key`: the only key the check commands accept (pulumi-command `host_key`)."""
    ssh_opts: list[str] | None = None
    """The Docker provider's ssh options (`stacks.ssh_trust.docker_ssh_opts`: pinned to the host key)."""


class GpuNode(pulumi.ComponentResource):
    provider: docker.Provider
    image: docker.RemoteImage
    connection: command.remote.ConnectionArgs
    preflight: command.remote.Command

    def __init__(self, name: str, args: GpuNodeArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("vllm-cluster:index:GpuNode", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.provider = docker.Provider(
            f"{name}-docker", host=f"ssh://{args.ssh_user}@{args.ssh_host}:{args.ssh_port}",
            ssh_opts=list(args.ssh_opts if args.ssh_opts is not None else SSH_OPTS), opts=child)
        # keep_locally: a rollback to this image must not re-pull ~20 GB, and `pulumi destroy` keeps it too.
        self.image = docker.RemoteImage(
            f"{name}-image", name=args.image, keep_locally=True,
            opts=pulumi.ResourceOptions(parent=self, provider=self.provider))
        self.connection = command.remote.ConnectionArgs(
            host=args.ssh_host, user=args.ssh_user, port=args.ssh_port, private_key=args.ssh_private_key,
            host_key=args.host_key)
        self.preflight = command.remote.Command(
            f"{name}-preflight", connection=self.connection, create=args.preflight_command,
            triggers=list(args.preflight_triggers),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.image]))
        self.register_outputs({"image_id": self.image.image_id, "preflight": self.preflight.stdout})

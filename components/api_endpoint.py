"""ApiEndpoint: the OpenAI-compatible entry point, its optional nginx front door, and the post-deploy checks.

With the proxy on, the checks call the proxy (TLS, a client key), so they prove the path clients take. With vLLM
on loopback and no proxy they run on the head over SSH (`connection`), where the port can be reached.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_command as command
import pulumi_docker as docker

from stacks.planner.proxy import CONF_PATH, FRONT_SOCKET, TLS_CERT_PATH, TLS_KEY_PATH

PROXY_REPLACE_ON_CHANGES = ["uploads", "healthcheck", "command", "image"]
PROXY_START = f"rm -f {FRONT_SOCKET} && exec nginx -g 'daemon off;'"
"""The container's command: the stale socket of a killed nginx removed, then nginx in the foreground as PID 1."""


@dataclass(frozen=True)
class ProxyArgs:
    """The nginx container on the head node. `conf` holds keys, so it is a secret Output."""

    provider: docker.Provider
    image: str
    container_name: str
    conf: pulumi.Output[str]
    certificate: pulumi.Input[str] | None = None
    private_key: pulumi.Input[str] | None = None


@dataclass(frozen=True)
class ApiEndpointArgs:
    endpoint: str
    served_model: str
    health_command: str
    smoke_command: str
    triggers: list[pulumi.Input[str]]
    """Engine generation (and the group's secrets digest) plus the API check settings: any change re-runs the
    checks."""
    after: Sequence[pulumi.Resource]
    api_key: pulumi.Input[str] | None = None
    """The key the checks send: vLLM's own, or with the proxy the check client's."""
    tls_ca: pulumi.Input[str] | None = None
    """The proxy's certificate, the only one the checks trust."""
    proxy: ProxyArgs | None = None
    connection: command.remote.ConnectionArgs | None = None
    """Run the checks on the head over this connection (vLLM on loopback, no proxy); else where `pulumi up` runs."""
    node_checks: Mapping[str, tuple[command.remote.ConnectionArgs, str]] = field(default_factory=dict)
    """Hybrid load balancing: node -> (its connection, `api-node-<node>`): every node's own API server and each
    of its DP ranks; external: `<node>-rank-<r>` -> (the node's connection, `api-server-rank-<r>`): every DP
    rank's own server. Checked on the node itself, once the engines run."""


class ApiEndpoint(pulumi.ComponentResource):
    health: command.local.Command | command.remote.Command
    smoke: command.local.Command | command.remote.Command
    proxy_image: docker.RemoteImage | None
    proxy: docker.Container | None

    def __init__(self, name: str, args: ApiEndpointArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("vllm-cluster:index:ApiEndpoint", name, None, opts)
        self.proxy_image, self.proxy = self._proxy(name, args.proxy) if args.proxy else (None, None)
        env: dict[str, pulumi.Input[str]] = {}
        if args.api_key is not None:
            env["VLLM_API_KEY"] = pulumi.Output.secret(args.api_key)
        if args.tls_ca is not None:
            env["VLLM_TLS_CA"] = pulumi.Output.secret(args.tls_ca)
        after = [*args.after, *([self.proxy] if self.proxy else [])]
        if args.connection is not None:
            # On the head, in the engine container: its own VLLM_API_KEY is the key, nothing travels.
            self.health = command.remote.Command(
                f"{name}-health", connection=args.connection, create=args.health_command,
                triggers=list(args.triggers), opts=pulumi.ResourceOptions(parent=self, depends_on=after))
            self.smoke = command.remote.Command(
                f"{name}-smoke", connection=args.connection, create=args.smoke_command,
                triggers=list(args.triggers), opts=pulumi.ResourceOptions(parent=self, depends_on=[self.health]))
        else:
            # Runs where `pulumi up` runs (the project dir); the key travels in the environment,
            # never in argv or state outputs.
            self.health = command.local.Command(
                f"{name}-health", create=args.health_command, environment=env or None,
                triggers=list(args.triggers), opts=pulumi.ResourceOptions(parent=self, depends_on=after))
            self.smoke = command.local.Command(
                f"{name}-smoke", create=args.smoke_command, environment=env or None,
                triggers=list(args.triggers), opts=pulumi.ResourceOptions(parent=self, depends_on=[self.health]))
        self.node_checks: dict[str, command.remote.Command] = {
            node: command.remote.Command(
                f"{name}-{node}-api", connection=connection, create=check, triggers=list(args.triggers),
                opts=pulumi.ResourceOptions(parent=self, depends_on=list(args.after)))
            for node, (connection, check) in args.node_checks.items()}
        self.endpoint = pulumi.Output.from_input(args.endpoint)
        self.served_model = pulumi.Output.from_input(args.served_model)
        self.verification = pulumi.Output.all(self.health.stdout, self.smoke.stdout).apply(
            lambda outs: " / ".join(_last_line(o) for o in outs))
        self.register_outputs({"endpoint": self.endpoint, "served_model": self.served_model,
                               "verification": self.verification,
                               "proxy": self.proxy.id if self.proxy else None})

    def _proxy(self, name: str, args: ProxyArgs) -> tuple[docker.RemoteImage, docker.Container]:
        on_head = pulumi.ResourceOptions(parent=self, provider=args.provider)
        image = docker.RemoteImage(f"{name}-proxy-image", name=args.image, keep_locally=True, opts=on_head)
        uploads = [docker.ContainerUploadArgs(file=CONF_PATH, content=pulumi.Output.secret(args.conf),
                                              permissions="0600")]
        if args.certificate is not None and args.private_key is not None:
            uploads += [
                docker.ContainerUploadArgs(file=TLS_CERT_PATH, content=pulumi.Output.secret(args.certificate),
                                           permissions="0644"),
                docker.ContainerUploadArgs(file=TLS_KEY_PATH, content=pulumi.Output.secret(args.private_key),
                                           permissions="0600"),
            ]
        # The nginx image's entrypoint runs its own template scripts first; nginx itself is all we need. A socket
        # file left by a killed nginx would make the restart fail to bind (the container keeps its file system).
        container = docker.Container(
            f"{name}-proxy", name=args.container_name, image=image.image_id,
            entrypoints=["/bin/sh", "-c"], command=[PROXY_START], network_mode="host", restart="unless-stopped",
            uploads=uploads, must_run=True, logs=False,
            # `nginx -t` as the healthcheck: a config the image's nginx rejects fails this update at once.
            healthcheck=docker.ContainerHealthcheckArgs(tests=["CMD", "nginx", "-t", "-q"], interval="10s",
                                                        timeout="5s", retries=3, start_period="2s"),
            wait=True, wait_timeout=60,
            labels=[docker.ContainerLabelArgs(label="vllm-cluster.role", value="api-proxy"),
                    docker.ContainerLabelArgs(label="vllm-cluster.stack", value=pulumi.get_stack())],
            opts=pulumi.ResourceOptions(parent=self, provider=args.provider, delete_before_replace=True,
                                        replace_on_changes=PROXY_REPLACE_ON_CHANGES))
        return image, container


def _last_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[-1] if (text or "").strip() else ""

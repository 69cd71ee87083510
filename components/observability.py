"""Observability: node and DCGM exporters on every node, Prometheus, Grafana and (with a webhook) Alertmanager on the
monitoring node. Every file comes from `stacks.planner.observability` and travels in the Docker `uploads` input,
as the proxy's nginx.conf does; a changed file replaces that one container and nothing else (no engine depends
on a monitoring container). Each node's exporter waits for that node's engine container: its textfile says which
generation was applied there, so a half-applied update shows as differing generations.

Grafana reads its admin password file only when it creates its database, which outlives the container (a host
directory): after each new Grafana container, `<node>-grafana-admin-password` (checks/grafana_password.py, over
SSH on the monitoring node) logs in with the uploaded password and, when Grafana refuses it, sets it with Grafana's
CLI. The password file is readable by its owner only (Grafana runs as root here).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_command as command
import pulumi_docker as docker

from checks.bundle import heredoc_command
from stacks.planner.observability import (
    ALERTMANAGER_CONFIG,
    GRAFANA_DASHBOARDS,
    GRAFANA_PASSWORD_FILE,
    GRAFANA_PROVISIONING,
    PROMETHEUS_DIR,
    TEXTFILE,
    MonitorContainer,
    ObservabilityPlan,
    monitor_spec,
)

MONITOR_REPLACE_ON_CHANGES = ["uploads", "command", "image", "envs", "volumes"]


@dataclass(frozen=True)
class ObservabilityArgs:
    plan: ObservabilityPlan
    stack: str
    files: dict[str, str]
    """Generated path -> text (`render_files`), without alertmanager.yml, which holds the webhook secret."""
    providers: Mapping[str, docker.Provider]
    data_dir: str
    grafana_env: dict[str, str]
    admin_password: pulumi.Input[str]
    alertmanager_conf: pulumi.Output[str] | None = None
    engines: Mapping[str, Sequence[pulumi.Resource]] | None = None
    """Node -> its engine containers (one, or one per DP rank with external load balancing): the node's exporter
    (and its textfile) follows them."""
    connections: Mapping[str, command.remote.ConnectionArgs] | None = None
    """Node -> its SSH connection: where the Grafana password rotation runs (none: no rotation)."""


PASSWORD_ROTATION_TIMEOUT_S = 420
"""The rotation's outer limit: Grafana's start-up (its --wait-s, 300 s) and the CLI's run."""


def password_rotation_command(container: str, listen: str) -> str:
    """The shell command that makes the running Grafana's admin password the uploaded one (no secret in it)."""
    return heredoc_command("grafana_password", ["--container", container, "--url", f"http://{listen}",
                                                "--wait-s", "300"], timeout_s=PASSWORD_ROTATION_TIMEOUT_S)


def _upload(path: str, content: pulumi.Input[str], mode: str = "0644") -> docker.ContainerUploadArgs:
    return docker.ContainerUploadArgs(file=path, content=content, permissions=mode)


class Observability(pulumi.ComponentResource):
    containers: dict[str, docker.Container]

    def __init__(self, name: str, args: ObservabilityArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("vllm-cluster:index:Observability", name, None, opts)
        self.containers = {}
        images: dict[tuple[str, str], docker.RemoteImage] = {}
        for mc in args.plan.containers:
            key = (mc.node, mc.image)
            if key not in images:
                images[key] = docker.RemoteImage(
                    f"{name}-{mc.node}-{mc.role}-image", name=mc.image, keep_locally=True,
                    opts=pulumi.ResourceOptions(parent=self, provider=args.providers[mc.node]))
            self.containers[f"{mc.node}-{mc.role}"] = self._container(name, args, mc, images[key])
            if mc.role == "grafana" and args.connections and mc.node in args.connections:
                grafana = self.containers[f"{mc.node}-{mc.role}"]
                command.remote.Command(  # every new container: a new id, so the rotation runs again
                    f"{name}-{mc.node}-grafana-admin-password", connection=args.connections[mc.node],
                    create=password_rotation_command(mc.name, mc.listen), triggers=[grafana.id],
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[grafana]))
        self.register_outputs({"prometheus": args.plan.prometheus, "grafana": args.plan.grafana})

    def _container(self, name: str, args: ObservabilityArgs, mc: MonitorContainer,
                   image: docker.RemoteImage) -> docker.Container:
        files = args.files
        spec = monitor_spec(args.stack, mc, args.data_dir, args.grafana_env)  # what `drift` compares it with
        uploads: list[docker.ContainerUploadArgs] = []
        volumes = [docker.ContainerVolumeArgs(host_path=v.host, container_path=v.container,
                                              read_only=v.read_only or None) for v in spec.volumes]
        depends: list[pulumi.Resource] = []
        caps = docker.ContainerCapabilitiesArgs(adds=spec.capabilities) if spec.capabilities else None
        if mc.role == "node-exporter":
            uploads.append(_upload(TEXTFILE, files[f"textfile/{mc.node}.prom"]))
            if args.engines and mc.node in args.engines:
                depends.extend(args.engines[mc.node])
        elif mc.role == "prometheus":
            uploads += [_upload(f"{PROMETHEUS_DIR}/{rel}", text) for rel, text in files.items()
                        if rel == "prometheus.yml" or rel.startswith("rules/")]
        elif mc.role == "grafana":
            uploads += [_upload(f"{GRAFANA_PROVISIONING}/{rel.removeprefix('grafana/provisioning/')}", text)
                        for rel, text in files.items() if rel.startswith("grafana/provisioning/")]
            uploads += [_upload(f"{GRAFANA_DASHBOARDS}/{rel.removeprefix('grafana/dashboards/')}", text)
                        for rel, text in files.items() if rel.startswith("grafana/dashboards/")]
            # Inside the container only, read by Grafana (root here) and the rotation's `docker exec … cat`
            uploads.append(_upload(GRAFANA_PASSWORD_FILE, pulumi.Output.secret(args.admin_password), "0400"))
        elif mc.role == "alertmanager" and args.alertmanager_conf is not None:
            # the webhook URL carries its token: readable by its owner only (Alertmanager runs as root here)
            uploads.append(_upload(ALERTMANAGER_CONFIG, pulumi.Output.secret(args.alertmanager_conf), "0600"))
        envs = [f"{k}={v}" for k, v in spec.env.items()]
        return docker.Container(
            f"{name}-{mc.node}-{mc.role}", name=mc.name, image=image.image_id, command=mc.args or None,
            network_mode=spec.network_mode, restart=spec.restart, uploads=uploads, volumes=volumes, envs=envs or None,
            gpus=spec.gpus, capabilities=caps, must_run=True, logs=False,
            # Prometheus and Grafana run as non-root users; their data directories are theirs to create
            user="0" if mc.role in ("prometheus", "grafana", "alertmanager") else None,
            labels=[docker.ContainerLabelArgs(label=k, value=v) for k, v in spec.labels.items()],
            opts=pulumi.ResourceOptions(parent=self, provider=args.providers[mc.node], depends_on=depends,
                                        delete_before_replace=True, replace_on_changes=MONITOR_REPLACE_ON_CHANGES))

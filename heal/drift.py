"""What changed on the hosts behind Pulumi's back: the plan's containers against `docker inspect` (pure).

`pulumi refresh` cannot see it: the engine's checks are pulumi-command remote commands, which have no Read, and
a container restarted by hand, an image tag moved to another build, a variable set by hand or a compose container
started next to the engine stays invisible until the next failure. This module compares, for one node, the
planned `ContainerSpec` with what the node's Docker engine reports, and lists the other containers that use the
node's GPUs or ports. The caller (heal/node_access.py, `python -m stacks drift`) fetches the JSON.

Secret variables (`secret_env`) are compared by name only: their values are never read into a row. A variable the
plan does not set is shown by name only too (it may be a secret someone added by hand).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from stacks.model.masking import mask_secrets
from stacks.planner.container_spec import LABEL_PREFIX, SECRETS_LABEL, WEIGHTS_VERSION, ContainerSpec

KINDS = ("missing", "image", "command", "entrypoint", "env", "labels", "restart-policy", "mounts", "gpus",
         "network", "ipc", "privileged", "capabilities", "devices", "ulimits", "shm-size", "healthcheck",
         "restarted", "foreign", "monitoring")
"""Every kind of row. `restarted` and `monitoring` are informative (the supervisor's own restarts show up in the
first; the second is a change to one of the stack's own non-engine containers, which a group restart neither stops
nor starts); every other kind means the container is not what the plan created, and the supervisor refuses to
restart into it."""
INFORMATIVE = ("restarted", "monitoring")

GPU_READERS = ("dcgm-exporter",)
"""Roles of the stack's own containers that are given the GPUs to read them: NVIDIA's DCGM exporter reads counters
through NVML/DCGM (`--gpus all` so the devices are visible) and creates no CUDA context, so it allocates no GPU
memory and takes nothing the engine's `gpu_memory_utilization` counts on. Any other own container holding GPUs was
changed by hand and is treated as foreign."""

RESTART_SLACK_S = 120
"""A container started later than this after it was created has been restarted since Pulumi created it."""


@dataclass(frozen=True)
class DriftRow:
    node: str
    container: str
    kind: str
    plan: str
    found: str

    @property
    def blocking(self) -> bool:
        """A restart would bring back something the plan did not create."""
        return self.kind not in INFORMATIVE

    def as_dict(self) -> dict[str, str | bool]:
        """The row for `drift --json`, each text masked (a hand-set argv or label may hold a credential)."""
        return {"node": self.node, "container": self.container, "kind": self.kind, "plan": mask_secrets(self.plan),
                "found": mask_secrets(self.found), "blocking": self.blocking}


def _env(items: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        name, _, value = item.partition("=")
        out[name] = value
    return out


def gpus_of(host_config: dict[str, Any]) -> str:
    """Docker's DeviceRequests as `--gpus` spells them: `all`, `device=0,1`, `count=N` or `none`."""
    for request in host_config.get("DeviceRequests") or []:
        caps = [c for group in request.get("Capabilities") or [] for c in group]
        if "gpu" not in caps:
            continue
        if request.get("DeviceIDs"):
            return "device=" + ",".join(request["DeviceIDs"])
        count = request.get("Count", 0)
        return "all" if count == -1 else f"count={count}"
    return "none"


def _planned_gpus(spec: ContainerSpec) -> str:
    if spec.gpus is None:
        return "none"
    if spec.gpus.startswith(("device=", "count=")) or spec.gpus == "all":
        return spec.gpus
    return f"count={spec.gpus}" if spec.gpus.isdigit() else spec.gpus


def _as_planned(mount: str, planned: set[str]) -> str:
    """A model version directory (`…@<16 hex>`, the sync's choice) as the plan writes it (`…@<version>`)."""
    versioned = re.sub(r"@[0-9a-f]{16}:", f"@{WEIGHTS_VERSION}:", mount, count=1)
    return versioned if versioned in planned else mount


def _mounts(inspect: dict[str, Any], image_volumes: set[str]) -> set[str]:
    found = set()
    for mount in inspect.get("Mounts") or []:
        if mount.get("Type") == "volume" and not mount.get("Name", "").strip("0123456789abcdef") \
                and mount.get("Destination") in image_volumes:
            continue  # the image's own VOLUME: an anonymous volume docker adds to every container of it
        mode = "rw" if mount.get("RW", True) else "ro"
        source = mount.get("Source") if mount.get("Type") == "bind" else f"volume:{mount.get('Name')}"
        found.add(f"{source}:{mount.get('Destination')}:{mode}")
    return found


def _time(text: str) -> datetime | None:
    """Docker's RFC 3339 time with nanoseconds (Python reads microseconds at most)."""
    if not text or text.startswith("0001-"):
        return None
    head, _, frac = text.rstrip("Z").partition(".")
    zone = ""
    for sign in ("+", "-"):
        if sign in frac:
            frac, _, rest = frac.partition(sign)
            zone = sign + rest
    try:
        return datetime.fromisoformat(f"{head}.{(frac or '0')[:6].ljust(6, '0')}{zone or '+00:00'}")
    except ValueError:
        return None


def compare_container(node: str, spec: ContainerSpec, inspect: dict[str, Any] | None, image_id: str | None,
                      image_config: dict[str, Any] | None, container: str | None = None,
                      restart_slack_s: float = RESTART_SLACK_S) -> list[DriftRow]:
    """Rows for one planned container. `inspect` is `docker inspect <container>` (None: no such container),
    `image_id` the ID the planned image reference resolves to on that node now (None: not there), `image_config`
    that image's `Config` (its own env, labels, entrypoint and volumes, which docker merges into the container)."""
    name = container or spec.name
    rows: list[DriftRow] = []

    def row(kind: str, plan: str, found: str) -> None:
        rows.append(DriftRow(node, name, kind, plan, found))

    if inspect is None:
        row("missing", f"container {name} from {spec.image}", "no such container")
        return rows
    config = inspect.get("Config") or {}
    host = inspect.get("HostConfig") or {}
    image = image_config or {}
    # VllmEngine creates the container from the pulled image's ID (components/vllm_engine.py container_args), so
    # `Config.Image` is that ID; a container created by hand names a reference instead.
    created_from = str(config.get("Image") or "")
    if created_from not in (spec.image, inspect.get("Image")):
        row("image", spec.image, f"created from {created_from}")
    if image_id is None:
        row("image", f"{spec.image} present on the node", "not on the node (removed or never pulled)")
    elif inspect.get("Image") != image_id:
        row("image", f"{spec.image} = {image_id[:19]}", f"container runs {str(inspect.get('Image'))[:19]} (the tag "
            "now names another build, or the container is older than the image)")
    want_cmd = spec.command or list(image.get("Cmd") or [])  # no command planned: docker runs the image's
    if (config.get("Cmd") or []) != want_cmd:
        row("command", *argv_difference(want_cmd, list(config.get("Cmd") or [])))
    want_entry = spec.entrypoint if spec.entrypoint is not None else image.get("Entrypoint")
    if (config.get("Entrypoint") or None) != (want_entry or None):
        row("entrypoint", *argv_difference(list(want_entry or []), list(config.get("Entrypoint") or [])))
    env, image_env = _env(config.get("Env")), _env(image.get("Env"))
    for key, value in sorted(spec.env.items()):
        if key not in env:
            row("env", f"{key}={value}", f"{key} not set")
        elif env[key] != value:
            row("env", f"{key}={value}", f"{key}={env[key]}")
    for key in sorted(spec.secret_env):
        if key not in env:
            row("env", f"{key} (secret, from {spec.secret_env[key]})", f"{key} not set")
    for key in sorted(set(env) - set(spec.env) - set(spec.secret_env)):
        if image_config is not None and image_env.get(key) == env[key]:
            continue  # the image's own variable, unchanged
        row("env", f"{key} not set by the plan", f"{key} set (value not shown)")
    labels, image_labels = config.get("Labels") or {}, image.get("Labels") or {}
    for key, value in sorted(spec.labels.items()):
        if labels.get(key) != value:
            row("labels", f"{key}={value}", f"{key}={labels[key]}" if key in labels else f"{key} missing")
    for key in sorted(set(labels) - set(spec.labels) - {SECRETS_LABEL}):  # the program's, random: not the plan's
        if image_labels.get(key) != labels[key]:
            row("labels", f"{key} not set by the plan", f"{key}={labels[key]}")
    policy = (host.get("RestartPolicy") or {}).get("Name") or "no"
    if policy != spec.restart:
        row("restart-policy", spec.restart, policy)
    want_mounts = {f"{v.host}:{v.container}:{'ro' if v.read_only else 'rw'}" for v in spec.volumes}
    found_mounts = {_as_planned(m, want_mounts) for m in _mounts(inspect, set((image.get("Volumes") or {}).keys()))}
    for mount in sorted(want_mounts - found_mounts):
        row("mounts", mount, "not mounted")
    for mount in sorted(found_mounts - want_mounts):
        row("mounts", "not in the plan", mount)
    if gpus_of(host) != _planned_gpus(spec):
        row("gpus", _planned_gpus(spec), gpus_of(host))
    for kind, plan, found in host_differences(spec, host, config.get("Healthcheck"), image.get("Healthcheck")):
        row(kind, plan, found)
    state = inspect.get("State") or {}
    created, started = _time(inspect.get("Created", "")), _time(state.get("StartedAt", ""))
    if inspect.get("RestartCount"):
        row("restarted", "started once by Pulumi", f"restarted {inspect['RestartCount']} time(s) by its restart "
            "policy")
    elif created and started and (started - created).total_seconds() > restart_slack_s:
        row("restarted", f"started at creation ({inspect.get('Created', '')[:19]})",
            f"started again at {state.get('StartedAt', '')[:19]} (by hand, or by the group supervisor: see its log)")
    return rows


def compare_monitoring(node: str, spec: ContainerSpec, inspect: dict[str, Any] | None, image_id: str | None,
                       image_config: dict[str, Any] | None, container: str | None = None) -> list[DriftRow]:
    """Rows for one of the stack's monitoring containers (`stacks.planner.observability.monitor_spec`), compared
    field by field as an engine container is (image, command, env, labels, restart policy, mounts, GPUs, network,
    IPC, privileged, capabilities, devices, ulimits, /dev/shm, health check), each row of kind `monitoring`
    (information: a group restart neither stops nor starts it; `pulumi up` puts it back) with the field named
    first. A monitoring container that takes GPUs or privileges it was not planned with is, on top, `foreign`
    (blocking: foreign_containers)."""
    return [DriftRow(r.node, r.container, "monitoring", f"{r.kind}: {r.plan}", r.found)
            for r in compare_container(node, spec, inspect, image_id, image_config, container)]


def foreign_containers(node: str, stack: str, own: set[str], inspects: list[dict[str, Any]],
                       ports: set[int], companions: dict[str, str] | None = None) -> list[DriftRow]:
    """Running containers on the node that the stack does not own and that take its GPUs or publish one of its
    planned ports (a host-network container's ports are not in docker's data: the clean step's port check sees
    those).

    `companions`: the stack's own non-engine containers planned on this node (name -> role: the exporters,
    Prometheus, Grafana, Alertmanager, the proxy). One is the stack's when it has BOTH its planned name and the
    label `vllm-cluster.stack=<stack>`: a label alone can be copied by any `docker run --label`, while a name is
    unique on a Docker engine and Pulumi holds it; the label on top tells Pulumi's container from a hand-run one
    that took the name after Pulumi's was removed. It is then not foreign, unless it holds GPUs its role does not
    read (GPU_READERS): that is a hand change that may take the engine's GPUs. A companion's name without the label
    is reported (informative, `monitoring`) when it uses nothing of the engine's, foreign when it does."""
    rows = []
    companions = companions or {}
    for inspect in inspects:
        name = str(inspect.get("Name", "")).lstrip("/")
        labels = (inspect.get("Config") or {}).get("Labels") or {}
        labelled = labels.get(f"{LABEL_PREFIX}.stack") == stack
        if name in own and labelled:
            continue
        if not (inspect.get("State") or {}).get("Running"):
            continue
        host = inspect.get("HostConfig") or {}
        role = companions.get(name)
        if role is not None and labelled and (role in GPU_READERS or (
                gpus_of(host) == "none" and not host.get("Privileged"))):
            continue  # the stack's own monitoring or proxy container, as planned: a restart does not touch it
        uses = []
        if gpus_of(host) != "none":
            uses.append(f"GPUs {gpus_of(host)}")
        if host.get("Privileged"):
            uses.append("privileged (sees every GPU)")
        bound = [*(host.get("PortBindings") or {}).values(),
                 *((inspect.get("NetworkSettings") or {}).get("Ports") or {}).values()]  # the latter: chosen ports
        published = {int(b.get("HostPort") or 0) for binds in bound for b in binds or []}
        clash = sorted(published & ports)
        if clash:
            uses.append("publishes port " + ",".join(map(str, clash)))
        if name in own:
            uses.append(f"has the engine's name without label {LABEL_PREFIX}.stack={stack}")
        if role is not None and labelled and uses:
            uses.append(f"the stack's {role} container, planned without GPUs")
        elif role is not None and not labelled:
            if not uses:
                rows.append(DriftRow(node, name, "monitoring", f"the stack's {role} container, label "
                                     f"{LABEL_PREFIX}.stack={stack}", f"{name} without that label (recreated by "
                                     "hand?): `pulumi up` puts it back; it uses nothing of the engine's"))
                continue
            uses.append(f"has the name of the stack's {role} container without label {LABEL_PREFIX}.stack={stack}")
        if not uses:
            continue
        project = labels.get("com.docker.compose.project")
        origin = f"compose project {project}" if project else "started by hand"
        rows.append(DriftRow(node, name, "foreign", "only the stack's containers",
                             f"{name} ({(inspect.get('Config') or {}).get('Image')}, {origin}): {'; '.join(uses)}"))
    return rows


def _network(mode: str | None) -> str:
    """Docker names its default network `default` in some versions and `bridge` in others."""
    return "bridge" if mode in (None, "", "default") else mode


def _cap(name: str) -> str:
    """`SYS_ADMIN`, `CAP_SYS_ADMIN` and `sys_admin` are one capability to Docker."""
    return name.upper().removeprefix("CAP_")


NS = 1_000_000_000
DEFAULT_SHM_BYTES = 64 * 1024 * 1024
"""Docker's /dev/shm without --shm-size."""


def host_differences(spec: ContainerSpec, host: dict[str, Any], health: dict[str, Any] | None,
                     image_health: dict[str, Any] | None = None) -> list[tuple[str, str, str]]:
    """(kind, plan, found) for every HostConfig field the plan sets (components/vllm_engine.py container_args) and
    the health check: a container recreated by hand with `--network none`, without `--ipc host` or the ulimits
    would run, but not as planned, so a restart into it is no heal. A plan without a health check means the
    image's own (`image_health`, its HEALTHCHECK), which Docker runs unless told otherwise."""
    out: list[tuple[str, str, str]] = []
    if _network(host.get("NetworkMode")) != _network(spec.network_mode):
        out.append(("network", spec.network_mode, _network(host.get("NetworkMode"))))
    ipc = host.get("IpcMode") or "private"
    if ipc != spec.ipc_mode and not (spec.ipc_mode in ("private", "shareable") and ipc in ("private", "shareable")):
        out.append(("ipc", spec.ipc_mode, ipc))
    if bool(host.get("Privileged")) != spec.privileged:
        out.append(("privileged", str(spec.privileged).lower(), str(bool(host.get("Privileged"))).lower()))
    want_caps, found_caps = {_cap(c) for c in spec.capabilities}, {_cap(c) for c in host.get("CapAdd") or []}
    if want_caps != found_caps or host.get("CapDrop"):
        dropped = f"; dropped {','.join(host['CapDrop'])}" if host.get("CapDrop") else ""
        out.append(("capabilities", ",".join(sorted(want_caps)) or "none added",
                    (",".join(sorted(found_caps)) or "none added") + dropped))
    want_dev = {f"{d}:{d}" for d in spec.devices}
    found_dev = {f"{d.get('PathOnHost')}:{d.get('PathInContainer')}" for d in host.get("Devices") or []}
    for device in sorted(want_dev - found_dev):
        out.append(("devices", device, "not mapped"))
    for device in sorted(found_dev - want_dev):
        out.append(("devices", "not in the plan", device))
    want_ul = {k: (v[0], v[1]) for k, v in spec.ulimits.items()}
    found_ul = {str(u.get("Name")): (u.get("Soft"), u.get("Hard")) for u in host.get("Ulimits") or []}
    for name in sorted(set(want_ul) | set(found_ul)):
        if want_ul.get(name) != found_ul.get(name):
            out.append(("ulimits", f"{name}={':'.join(map(str, want_ul[name]))}" if name in want_ul else
                        f"{name} not set by the plan",
                        f"{name}={':'.join(map(str, found_ul[name]))}" if name in found_ul else f"{name} not set"))
    want_shm = spec.shm_size_mb * 1024 * 1024 if spec.shm_size_mb else DEFAULT_SHM_BYTES
    found_shm = int(host.get("ShmSize") or DEFAULT_SHM_BYTES)
    if found_shm != want_shm:
        out.append(("shm-size", f"{want_shm // (1024 * 1024)} MB", f"{found_shm // (1024 * 1024)} MB"))
    want_health = _health(spec) if spec.healthcheck else _found_health(image_health, None)
    found_health = _found_health(health, spec.healthcheck.test if spec.healthcheck else None)
    if want_health != found_health:
        out.append(("healthcheck", want_health or "none", found_health or "none"))
    return out


def _health(spec: ContainerSpec) -> str | None:
    h = spec.healthcheck
    if h is None:
        return None
    return (f"{' '.join(h.test)} every {h.interval_s}s, timeout {h.timeout_s}s, {h.retries} retries, start period "
            f"{h.start_period_s}s")


def _found_health(health: dict[str, Any] | None, planned: list[str] | None) -> str | None:
    """Docker's Config.Healthcheck (durations in nanoseconds) as `_health` writes the plan's; none without a test
    (`NONE` is `--no-healthcheck`). `docker run --health-cmd` can only write the shell form: a `CMD-SHELL` whose
    words are exactly the planned `CMD` argv runs the same check, and reads as the plan's."""
    test = list((health or {}).get("Test") or [])
    if not test or test == ["NONE"]:
        return None
    if planned and planned[0] == "CMD" and test[0] == "CMD-SHELL" and len(test) == 2:
        try:
            if shlex.split(test[1]) == planned[1:]:
                test = list(planned)
        except ValueError:
            pass  # not shell words: shown as found
    h = health or {}

    def s(key: str) -> int:
        return int(h.get(key) or 0) // NS

    return (f"{' '.join(test)} every {s('Interval')}s, timeout {s('Timeout')}s, {int(h.get('Retries') or 0)} retries, "
            f"start period {s('StartPeriod')}s")


def argv_difference(plan: list[str], found: list[str], context: int = 2) -> tuple[str, str]:
    """Two argvs compared whole, shown where they differ: the first differing word, a few words around it, and
    both lengths, so a change at word 40 of a long vLLM command is not hidden behind a cut at 60 characters."""
    if plan == found:
        return " ".join(plan), " ".join(found)
    start = next((i for i, (a, b) in enumerate(zip(plan, found, strict=False)) if a != b), min(len(plan), len(found)))
    tail = 0
    while tail < min(len(plan), len(found)) - start and plan[-1 - tail] == found[-1 - tail]:
        tail += 1

    def shown(argv: list[str]) -> str:
        low, high = max(0, start - context), min(len(argv), max(len(argv) - tail, start) + context)
        words = " ".join(argv[low:high]).replace("\n", "\\n")
        return (f"{len(argv)} words; from word {start + 1}: " + ("… " if low else "") + (words or "(nothing)")
                + (" …" if high < len(argv) else ""))

    return shown(plan), shown(found)


def table(rows: list[DriftRow]) -> str:
    """A plain-text table, one row per difference."""
    head = ("NODE", "CONTAINER", "KIND", "PLAN", "FOUND")
    cells = [head, *((r.node, r.container, r.kind + ("" if r.blocking else " (info)"), mask_secrets(r.plan),
                      mask_secrets(r.found)) for r in rows)]
    widths = [min(60, max(len(c[i]) for c in cells)) for i in range(len(head) - 1)]
    return "\n".join("  ".join(c[i].ljust(widths[i]) for i in range(len(head) - 1)) + "  " + c[-1]
                     for c in cells) + "\n"

"""What a change costs: how each provider treats a changed input (replace, update in place, re-run), and the
downtime that follows. One pure module, used by the replacement matrix (`python -m stacks matrix`, computed by
running the real program under Pulumi's mocks for a change of every config key) and by `stacks diff`
(`review.downtime`, on the two plans of a PR).

The rules, each from the provider's or the engine's own source:

- docker `Container` (pulumi-docker, bridged from kreuzwerker/terraform-provider-docker): an input marked
  `willReplaceOnChanges` in the provider schema (ForceNew in `resource_docker_container.go`) replaces the
  container; so does one in the resource's `replace_on_changes` (VllmEngine adds `healthcheck`, which the
  provider would "update" without effect). The rest are updated in place: `restart` (with `max_retry_count`,
  CPU and memory limits) by `ContainerUpdate` (`resourceDockerContainerUpdate`: no restart of the process),
  `mustRun`, `wait`, `logs` and friends only change what the provider does.
- docker `RemoteImage`: `name`, `platform`, `pullTriggers`, `triggers` replace (a pull); `keepLocally` updates.
  A new image has a new `imageId`, so every container fed from it sees a changed `image` input.
- command `Command` (pulumi-command, provider/pkg/provider/common/inputs.go): `triggers` is
  `provider:"replaceOnChanges"`: a change replaces it, i.e. runs `create` again. Any other input change
  (`create`, `environment`, `connection`, …) is an update, and `Update` (remote/commandController.go) runs
  `update` when set, else `create` again. Either way the check runs again; neither touches an engine.
- a provider (`pulumi:providers:docker`): the bridge's `DiffConfig` (pulumi-terraform-bridge
  pkg/tfbridge/provider.go, `configDiffer`) replaces only for properties marked to force provider replacement,
  and pulumi-docker marks none (schema: no `willReplaceOnChanges` in `provider.inputProperties`): an update; the
  resources it manages are diffed with the new settings, not replaced.
- a component (`vllm-cluster:index:*`): no provider; a change to its inputs is recorded in the state, nothing runs.
- a command's ID is new on every create (pulumi-command: `resource.NewUniqueHex`); the engine containers carry
  their secrets holder's ID in a label, so a replaced holder replaces them (the mocks derive the ID from the
  command's triggers, review/registrations.py).
- Delete-before-replace dependents (step_generator.go `calculateDependentReplacements`) only follow property
  dependencies on a replaced resource: the program feeds no replaced container's output into another resource's
  input (its checks only `depends_on` the containers), so none arise.

Downtime: an engine container replaced, created or deleted takes the whole group down (vLLM is fail-stop; the
generation label moves every container together; `delete_before_replace` frees the GPUs first) from the delete of
the old containers until the new group answers /health: about the new plan's estimated load time. Images are
pulled and dry runs pass before anything is deleted, so they cost nothing. The proxy container being replaced
costs seconds of refused connections. Updates in place, re-run checks and state-only changes cost nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from stacks.planner.container_spec import GENERATION_LABEL, SECRETS_LABEL

CONTAINER = "docker:index/container:Container"
REMOTE_IMAGE = "docker:index/remoteImage:RemoteImage"
COMPONENT_PREFIX = "vllm-cluster:index:"
COMMAND_TYPES = frozenset({"command:remote:Command", "command:local:Command", "command:remote:CopyToRemote",
                           "command:remote:CopyFile"})

CONTAINER_REPLACE_INPUTS = frozenset({
    "capabilities", "cgroupParent", "cgroupnsMode", "command", "cpus", "deviceRequests", "devices", "dns",
    "dnsOpts", "dnsSearches", "domainname", "entrypoints", "envs", "gpus", "groupAdds", "hostname", "hosts",
    "image", "ipcMode", "labels", "logDriver", "logOpts", "mounts", "name", "networkMode", "networksAdvanced",
    "pidMode", "platform", "ports", "privileged", "publishAllPorts", "readOnly", "runtime", "securityOpts",
    "shmSize", "stdinOpen", "stopSignal", "stopTimeout", "storageOpts", "sysctls", "tty", "ulimits", "uploads",
    "user", "usernsMode", "volumes", "workingDir",
})
"""docker Container inputs marked `willReplaceOnChanges` in pulumi-docker's schema (ForceNew upstream)."""

CONTAINER_UPDATE_INPUTS = frozenset({
    "attach", "containerReadRefreshTimeoutMilliseconds", "cpuPeriod", "cpuQuota", "cpuSet", "cpuShares",
    "destroyGraceSeconds", "deviceReadBps", "deviceReadIops", "deviceWriteBps", "deviceWriteIops", "healthcheck",
    "init", "logs", "maxRetryCount", "memory", "memoryReservation", "memorySwap", "mustRun", "removeVolumes",
    "restart", "rm", "start", "tmpfs", "wait", "waitTimeout",
})
"""The other docker Container inputs: updated in place (`restart` and resource limits by `docker update`)."""

IMAGE_REPLACE_INPUTS = frozenset({"name", "platform", "pullTriggers", "triggers"})
COMMAND_REPLACE_INPUTS = frozenset({"triggers"})


SPEC_INPUTS: dict[str, str] = {
    "name": "name", "image": "image", "command": "command", "entrypoint": "entrypoints", "env": "envs",
    "secret_env": "envs", "network_mode": "networkMode", "ipc_mode": "ipcMode", "privileged": "privileged",
    "gpus": "gpus", "ulimits": "ulimits", "shm_size_mb": "shmSize", "volumes": "volumes", "devices": "devices",
    "capabilities": "capabilities", "restart": "restart", "labels": "labels", "healthcheck": "healthcheck",
}
"""Plan container-spec field (stacks/planner/container_spec.py ContainerSpec) -> the docker input VllmEngine feeds it
into; `purpose` and `vllm_args` feed none (prose, and a copy of `command`)."""


PROXY_PLAN_OUTSIDE_CONTAINER = ("check_client",)
"""Proxy plan fields (stacks/planner/plan.py ProxyPlan) that reach only the API checks; every other one is in the proxy
container's name, image, provider or nginx.conf upload (all replacing). The matrix row
`api.proxy.check_client` (with the proxy on) shows the proxy untouched; a test keeps the two in agreement."""


@dataclass(frozen=True)
class Registration:
    """One resource as the program registers it, in plain data (what the mocks saw)."""

    type: str
    name: str
    inputs: Mapping[str, Any]
    custom: bool = True
    replace_on_changes: tuple[str, ...] = ()
    delete_before_replace: bool = False


@dataclass(frozen=True)
class Action:
    kind: str
    """create, delete, replace, update, state (component inputs: recorded, nothing runs)"""
    inputs: tuple[str, ...]
    why: str


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def changed_inputs(old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[str, ...]:
    """Top-level input names whose value differs (secret values included: the wire form carries them)."""
    return tuple(sorted(k for k in set(old) | set(new) if _canonical(old.get(k)) != _canonical(new.get(k))))


def container_action(inputs: Iterable[str], replace_on_changes: Iterable[str] = ()) -> Action | None:
    """How pulumi-docker treats changed Container inputs."""
    inputs = tuple(sorted(inputs))
    if not inputs:
        return None
    forced = [i for i in inputs if i in CONTAINER_REPLACE_INPUTS]
    asked = [i for i in inputs if i in set(replace_on_changes) or "*" in set(replace_on_changes)]
    if forced or asked:
        return Action("replace", inputs, "willReplaceOnChanges: " + ", ".join(forced) if forced else
                      "replace_on_changes: " + ", ".join(asked))
    if all(i in CONTAINER_UPDATE_INPUTS for i in inputs):
        return Action("update", inputs, "updated in place (docker update / provider settings)")
    return Action("replace", inputs, "input not in pulumi-docker's schema: assumed to replace")


def action(old: Registration | None, new: Registration | None) -> Action | None:
    """What `pulumi up` does to one resource, given what the program registered before and after a change."""
    if old is None and new is None:
        return None
    if old is None:
        assert new is not None
        return Action("create", (), "new resource")
    if new is None:
        return Action("delete", (), "no longer registered")
    inputs = changed_inputs(old.inputs, new.inputs)
    if not inputs:
        return None
    if new.type.startswith(COMPONENT_PREFIX) or not new.custom:
        return Action("state", inputs, "component: recorded in the state, nothing runs")
    if new.type == CONTAINER:
        return container_action(inputs, new.replace_on_changes)
    if new.type == REMOTE_IMAGE:
        if any(i in IMAGE_REPLACE_INPUTS for i in inputs):
            return Action("replace", inputs, "a new image is pulled")
        return Action("update", inputs, "image settings only")
    if new.type in COMMAND_TYPES:
        if any(i in COMMAND_REPLACE_INPUTS for i in inputs):
            return Action("replace", inputs, "triggers changed: create runs again")
        return Action("update", inputs, "update runs `update`, or `create` again")
    if new.type.startswith("pulumi:providers:"):
        return Action("update", inputs, "provider settings updated; its resources are not replaced")
    return Action("replace", inputs, f"no rule for {new.type}: assumed to replace")


MONITORING_ROLES = ("node-exporter", "dcgm-exporter", "prometheus", "grafana", "alertmanager")
"""`vllm-cluster.role` of the monitoring containers (components/observability.py): replacing one serves on."""


def is_monitoring(reg: Registration) -> bool:
    labels = reg.inputs.get("labels") or []
    return reg.type == CONTAINER and any(isinstance(x, Mapping) and x.get("label") == "vllm-cluster.role"
                                         and x.get("value") in MONITORING_ROLES for x in labels)


def is_engine(reg: Registration) -> bool:
    labels = reg.inputs.get("labels") or []
    return reg.type == CONTAINER and any(isinstance(x, Mapping) and x.get("label") == GENERATION_LABEL
                                         for x in labels)


# --- impact of one change --------------------------------------------------------------------------------

@dataclass
class Impact:
    """What one change does, by kind of resource. Names are normalised (`<node>`, `<container>`)."""

    engines: str = ""
    """`replaced` (the whole group), `partial` (some containers: a lone-rank restart), `updated` (in place), ''"""
    engine_inputs: list[str] = field(default_factory=list)
    engines_added_removed: list[str] = field(default_factory=list)
    """engine containers created or deleted (a node added, removed or renamed): new processes by definition"""
    images: list[str] = field(default_factory=list)
    proxy: str = ""
    checks: list[str] = field(default_factory=list)
    providers: list[str] = field(default_factory=list)
    state: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)
    unclassified: list[str] = field(default_factory=list)
    checks_total: list[str] = field(default_factory=list)
    """every check (command) the stack registers before the change: `checks` equal to it means all re-run"""
    actions: dict[str, str] = field(default_factory=dict)
    """normalised resource name -> `kind: why (inputs)`"""


_STRENGTH = {"": 0, "updated": 1, "replaced": 2, "partial": 3}


def _merge_level(a: str, b: str) -> str:
    return a if _STRENGTH[a] >= _STRENGTH[b] else b


def actions(olds: Mapping[str, Registration], news: Mapping[str, Registration]) -> dict[str, Action]:
    """Each resource's action, by name."""
    acts = {name: action(olds.get(name), news.get(name)) for name in sorted(set(olds) | set(news))}
    return {name: act for name, act in acts.items() if act is not None}


def secrets_holders(regs: Iterable[Registration]) -> set[str]:
    """The commands whose ID an engine container carries in its secrets label (the mocks' ID is `<name>-<hex>`):
    what the group is replaced with when a secret changes, not a check."""
    return {str(x.get("value", "")).rsplit("-", 1)[0] for r in regs if is_engine(r)
            for x in r.inputs.get("labels") or [] if isinstance(x, Mapping) and x.get("label") == SECRETS_LABEL}


def impact(old: list[Registration], new: list[Registration], normalise: Callable[[str], str] = str) -> Impact:
    """Every resource's action, summarised: the engine group as a whole, images, proxy, checks, the rest."""
    olds = {r.name: r for r in old}
    news = {r.name: r for r in new}
    out = Impact()
    engines = {n for n, r in {**olds, **news}.items() if is_engine(r)}
    holders = secrets_holders([*olds.values(), *news.values()])
    moved: set[str] = set()
    updated: set[str] = set()
    for name, act in actions(olds, news).items():
        reg = news.get(name) or olds[name]
        label = normalise(name)
        out.actions[label] = f"{act.kind}: {act.why}" + (f" ({', '.join(act.inputs)})" if act.inputs else "")
        if name in engines:
            (moved if act.kind in ("replace", "create", "delete") else updated).add(name)
            if act.kind in ("create", "delete"):
                out.engines_added_removed.append(f"{label} ({act.kind})")
            out.engine_inputs = sorted(set(out.engine_inputs) | set(act.inputs))
        elif is_monitoring(reg):
            out.other.append(f"{label} ({act.kind})")  # metrics pause; nothing stops serving
        elif reg.type == CONTAINER:
            out.proxy = _merge_level(out.proxy, "replaced" if act.kind in ("replace", "create", "delete")
                                     else "updated")
        elif reg.type == REMOTE_IMAGE:
            out.images.append(f"{label} ({'pulled' if act.kind in ('replace', 'create') else act.kind})")
        elif reg.type in COMMAND_TYPES and name not in holders:
            out.checks.append(label)
        elif reg.type.startswith("pulumi:providers:"):
            out.providers.append(f"{label} ({act.kind})")
        elif act.kind == "state":
            out.state.append(label)
        else:
            out.other.append(f"{label} ({act.kind})")
            if "no rule for" in act.why:
                out.unclassified.append(reg.type)
    out.checks_total = sorted({normalise(r.name) for r in old if r.type in COMMAND_TYPES})
    if moved:
        out.engines = "replaced" if moved == engines else "partial"
    elif updated:
        out.engines = "updated"
    for attr in ("images", "checks", "providers", "state", "other", "unclassified", "engines_added_removed"):
        setattr(out, attr, sorted(dict.fromkeys(getattr(out, attr))))
    return out


def merge(a: Impact, b: Impact) -> Impact:
    """Two mutations of one key (e.g. on each node): the union, the stronger engine effect."""
    out = Impact(engines=_merge_level(a.engines, b.engines), proxy=_merge_level(a.proxy, b.proxy))
    for attr in ("engine_inputs", "images", "checks", "providers", "state", "other", "unclassified", "checks_total",
                 "engines_added_removed"):
        setattr(out, attr, sorted(set(getattr(a, attr)) | set(getattr(b, attr))))
    out.actions = {**a.actions, **b.actions}
    return out


# --- downtime --------------------------------------------------------------------------------------------

def duration(seconds: int) -> str:
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


@dataclass(frozen=True)
class Downtime:
    kind: str
    """group (the engine group restarts), lone-rank (a bug: part of the group), proxy, none, unknown"""
    seconds: int | None
    text: str


def downtime(engines: str, proxy: str, estimate_s: int | None) -> Downtime:
    """The serving time a change costs, from what it does to the engine group and the proxy."""
    if engines == "partial":
        return Downtime("lone-rank", estimate_s, "LONE-RANK RESTART: only part of the engine group is replaced; the "
                        "rest hangs against it (vLLM is fail-stop) until the whole group restarts")
    if engines == "replaced":
        how = (f"about {duration(estimate_s)} (the new plan's modelled outage)"
               if estimate_s else "until the new group is healthy (no load estimate in the plan)")
        return Downtime("group", estimate_s, f"the whole engine group is down {how}: from the delete of the old "
                        "containers until the new group answers /health; images are pulled and dry runs pass "
                        "before, while it serves")
    if proxy == "replaced":
        return Downtime("proxy", 5, "seconds: the proxy container is replaced; the engines keep serving")
    if engines == "updated":
        return Downtime("none", 0, "none: the engine containers are updated in place (docker update), no process "
                        "restarts")
    return Downtime("none", 0, "none: no engine or proxy container is replaced (checks re-run where their inputs "
                    "changed)")


# --- rows of the matrix ----------------------------------------------------------------------------------

@dataclass
class Row:
    stack: str
    key: str
    context: str
    """'' or the feature the key was evaluated with (e.g. the proxy on)"""
    change: str
    refused: str | None
    impact: Impact
    downtime: Downtime
    diff_downtime: str = ""
    """what `stacks diff` says of the same change from the two plans alone (its downtime kind): equal to
    `downtime.kind` except where only a secret changes, which no plan shows"""


def row_dict(row: Row) -> dict[str, Any]:
    return asdict(row)


def _cell(items: list[str], limit: int = 6) -> str:
    if not items:
        return "–"
    shown = items[:limit]
    return ", ".join(f"`{i}`" for i in shown) + (f" (+{len(items) - limit})" if len(items) > limit else "")


_CHECK_PREFIX = re.compile(r"^(?:(?:engine|fabric)-(?:<node>-)?|<node>-)")


def check_name(name: str) -> str:
    """`fabric-<node>-nccl-transport` -> `nccl-transport`: the check, whichever node it runs on."""
    return _CHECK_PREFIX.sub("", name)


def _checks_cell(checks: list[str], every: list[str]) -> str:
    if not checks:
        return "–"
    if every and set(checks) >= set(every):
        return "all"
    return _cell(sorted(dict.fromkeys(check_name(c) for c in checks)), 8)


def _engine_cell(row: Row) -> str:
    return {"replaced": "**replaced**", "partial": "**PARTIAL**", "updated": "updated in place", "": "–"}[
        row.impact.engines]


def summary(row: Row) -> tuple[str, ...]:
    """What a row does, as table cells (everything but the key and the downtime)."""
    if row.refused is not None:
        return ("refused alone", "", "", "", "")
    imp = row.impact
    images = "pulled" if any("pulled" in i for i in imp.images) else ("updated" if imp.images else "–")
    other = [*imp.providers, *(f"{s} (state)" for s in imp.state), *imp.other]
    return (_engine_cell(row), images, imp.proxy or "–", _checks_cell(imp.checks, imp.checks_total), _cell(other, 3))


def _downtime_cell(rows: list[Row]) -> str:
    kinds = {r.downtime.kind for r in rows if r.refused is None}
    if not kinds:
        return "–"
    if "lone-rank" in kinds:
        return "**lone-rank restart**"
    if "group" in kinds:
        seconds = sorted({r.downtime.seconds for r in rows if r.downtime.kind == "group" and r.downtime.seconds})
        if not seconds:
            return "until healthy"
        low, high = seconds[0], seconds[-1]
        return f"≈ {duration(low)}" if low == high else f"≈ {duration(low)} – {duration(high)}"
    if "proxy" in kinds:
        return "seconds"
    return "none"


def markdown(rows: list[Row], stacks: list[str]) -> str:
    """The table of docs/what-a-change-costs.md: keys with the same effect in every stack share a row; downtime
    per stack."""
    groups: dict[tuple[Any, ...], list[str]] = {}
    by_key: dict[tuple[str, str], dict[str, Row]] = {}
    for row in rows:
        by_key.setdefault((row.key, row.context), {})[row.stack] = row
    for (key, context), per_stack in by_key.items():
        shape = tuple((s, summary(per_stack[s]), _downtime_cell([per_stack[s]]))
                      if s in per_stack else (s, None, None) for s in stacks)
        effects = {cells for _, cells, _ in shape if cells is not None}
        cells = next(iter(effects)) if len(effects) == 1 else None
        label = f"`{key}`" + (f" ({context})" if context else "")
        groups.setdefault((cells, tuple(d for _, _, d in shape)) if cells else (shape,), []).append(label)
    header = ["| keys | engine group | images | proxy | commands re-run (checks) | other | " +
              " | ".join(f"downtime `{s}`" for s in stacks) + " |",
              "|---|---|---|---|---|---|" + "---|" * len(stacks)]
    lines = []
    for group_key, keys in groups.items():
        if len(group_key) == 2:
            cells, downs = group_key
            lines.append(f"| {', '.join(keys)} | " + " | ".join(cells) + " | " + " | ".join(downs) + " |")
        else:
            (shape,) = group_key
            for stack, cells, down in shape:
                if cells is None:
                    continue
                lines.append(f"| {', '.join(keys)} (`{stack}`) | " + " | ".join(cells) + " | " +
                             " | ".join(down if s == stack else "" for s in stacks) + " |")
    return "\n".join(header + lines) + "\n"


def text(rows: list[Row]) -> str:
    """Every row in full, for a terminal."""
    out = []
    for row in rows:
        where = f"{row.stack} {row.key}" + (f" [{row.context}]" if row.context else "")
        if row.refused is not None:
            out.append(f"{where}: refused alone ({row.refused})")
            continue
        out.append(f"{where}: {row.change}")
        out.append(f"    downtime: {row.downtime.text}")
        for name, what in sorted(row.impact.actions.items()):
            out.append(f"    {name}: {what}")
        if not row.impact.actions:
            out.append("    nothing changes in what the program registers")
    return "\n".join(out) + "\n"


# --- normalised names ------------------------------------------------------------------------------------

_RANK = re.compile(r"-rank-[0-9]+(?=-|$)")


def normaliser(node_names: Iterable[str], container_names: Iterable[str]) -> Callable[[str], str]:
    """Resource name -> the same with node and container names as `<node>` / `<container>` (a DP rank's container
    `<container>-dp<r>`, its check `…-rank-<r>-…`)."""
    names = sorted({n for n in node_names if n}, key=len, reverse=True)
    containers = sorted({c for c in container_names if c}, key=len, reverse=True)
    node_re = re.compile(r"(?<![A-Za-z0-9])(" + "|".join(map(re.escape, names)) + r")(?![A-Za-z0-9])") if names \
        else None
    # external load balancing names a container per DP rank `<container>-dp<r>`: one row entry for all of them
    box_re = re.compile(r"(?<![A-Za-z0-9])(" + "|".join(map(re.escape, containers)) + r")(-dp[0-9]+)?$") \
        if containers else None

    def normalise(name: str) -> str:
        if box_re is not None:
            name = box_re.sub(lambda m: "<container>" + ("-dp<r>" if m.group(2) else ""), name)
        if node_re is not None:
            name = node_re.sub("<node>", name)
        return _RANK.sub("-rank-<r>", name)  # a check per DP rank (`api-<node>-rank-<r>-api`): one entry

    return normalise

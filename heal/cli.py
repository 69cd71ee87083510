"""`python -m stacks restart-group|drift|supervisor-unit|supervise STACK`: the group restart by hand, the drift
report, and the supervisor's unit and loop. The logic lives in heal/group.py, drift.py and supervisor.py."""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import ssl
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, urlsplit

from heal.drift import DriftRow, compare_container, compare_monitoring, foreign_containers, table
from heal.full_venv import CHECKS, CHECKS_WHAT, needs, unit_python
from heal.group import Group, group_of, render_steps
from heal.node_access import AccessError, MappedAccess, NodeAccess, access_for, inspect
from heal.supervisor import WEBHOOK_ENV, DeployLock, Log, Settings, Supervisor, lock_path, masked_url, restart_group
from stacks.model.config import StackConfig
from stacks.model.errors import ConfigError
from stacks.model.golden import golden_json
from stacks.model.loader import PROJECT_ROOT, load_stack
from stacks.model.masking import mask_secrets
from stacks.model.project import STACKS, workdir_problem
from stacks.planner.container_spec import ContainerSpec
from stacks.planner.observability import grafana_env, monitor_spec
from stacks.planner.plan import Plan, build_plan, thinking_args
from stacks.planner.topology import endpoint_rank_nodes


def _say(text: str) -> None:
    """A message on stderr, through the one masking rule: refusals and failures carry exception text (a node's ssh
    or docker stderr, an unreadable file's error) that may echo a credential from an env var or a URL."""
    print(mask_secrets(text), file=sys.stderr)


def golden_argv(plan: Plan, config: StackConfig, python: str) -> tuple[str, ...]:
    """One round of the API check with the stack's golden set on every DP rank (the watch unit's probe)."""
    dp_size, rank_nodes = endpoint_rank_nodes([(n.name, n.dp_ranks, n.role) for n in plan.nodes],
                                              plan.topology.get("load_balancing", "internal"))
    argv = [python, "-m", "checks.api", "--name", f"group-restart-{plan.stack}", "--url", plan.endpoint,
            "--served-name", config.model.served_name, "--sections", "health,models,chat", "--deadline-s", "600",
            "--timeout-s", str(config.api.request_timeout_s), "--golden-json", golden_json(config.api.smoke.golden),
            "--api-key-env", "VLLM_API_KEY", "--dp-size", str(dp_size)]
    if rank_nodes:
        argv += ["--rank-nodes", ",".join(rank_nodes)]
    return tuple(argv + thinking_args(config, ["chat"]))


def golden_max_age_s(config: StackConfig, dp_size: int) -> int:
    """How old a watch unit's golden result may be and still count: three of its rounds, plus one round's worst
    case (every rank's every golden prompt timing out), since a hung rank slows the round that reports it."""
    return 3 * config.api.watch_interval_s + dp_size * len(config.api.smoke.golden) * config.api.request_timeout_s


def golden_url(plan: Plan, flag: str | None) -> str | None:
    """The watch unit's `/metrics`: the flag, else where the plan puts it (observability on), else None."""
    if flag is not None:
        return flag or None
    if plan.observability is None:
        return None
    return f"http://{plan.observability.watch_target}/metrics"


def metrics_listen(plan: Plan, flag: str | None) -> str | None:
    """Where the supervisor serves its metrics: the flag, else where the plan puts it (observability on:
    `observability.supervisor_address:ports.supervisor`, which the planned Prometheus scrapes), else None."""
    if flag is not None:
        return flag or None
    if plan.observability is None:
        return None
    return plan.observability.supervisor_target


def check_metrics_listen(value: str | None, from_plan: bool = False) -> str | None:
    """Why `--metrics-listen` cannot be served, or None: checked before anything acts."""
    if not value:
        return None
    from checks.api import ConfigProblem, parse_listen  # in the functions: the plan-only venv has no httpx

    where = (" (from the stack: observability.supervisor_address and observability.ports.supervisor)"
             if from_plan else "")
    try:
        host, _ = parse_listen(value, example="10.30.8.1:9465")
    except ConfigProblem as exc:
        return f"{exc}{where}; '' serves nothing"
    if ipaddress.ip_address(host).is_unspecified:  # as observability.supervisor_address refuses it
        return (f"--metrics-listen {value!r}: a wildcard address would serve the metrics on every interface; give "
                f"this host's one private address, e.g. 10.30.8.1:9465{where}; '' serves nothing")
    return None


WEEK_S = 7 * 24 * 3600
DURATIONS = {"--interval-s": 30.0, "--hang-s": 600.0, "--backoff-first-s": 60.0, "--backoff-max-s": 1800.0,
             "--probe-timeout-s": 10.0}
"""The supervisor's durations and their defaults (seconds)."""
MAX_PER_HOUR = (1, 60, 4)
"""--max-per-hour: lowest, highest, default (restarts in any hour)."""


def check_timing(args: argparse.Namespace) -> str | None:
    """Why the supervisor's timing flags cannot work together, or None. A flag `args` lacks (the unit passes only
    some) counts as its default. NaN and infinity fail: a wait that never ends detects nothing."""
    values = {flag: getattr(args, flag[2:].replace("-", "_"), None) for flag in DURATIONS}
    for flag, value in values.items():
        if value is not None and not 0.1 <= value <= WEEK_S:
            return (f"{flag} {value}: must be at least 0.1 and at most {WEEK_S} seconds (a week); default "
                    f"{DURATIONS[flag]:g}")
    at = {flag: DURATIONS[flag] if value is None else value for flag, value in values.items()}
    age = getattr(args, "golden_max_age_s", None)
    if age is not None and not 0 < age <= WEEK_S:
        return (f"--golden-max-age-s {age}: must be more than 0 and at most {WEEK_S} seconds (a week); default: "
                "three watch rounds plus one round's timeouts")
    count = getattr(args, "max_per_hour", None)
    low, high, default = MAX_PER_HOUR
    if count is not None and not low <= count <= high:
        return (f"--max-per-hour {count}: must be a whole number of restarts from {low} to {high} in any hour; "
                f"default {default}")
    if at["--backoff-first-s"] > at["--backoff-max-s"]:
        return (f"--backoff-first-s {at['--backoff-first-s']:g} is more than --backoff-max-s "
                f"{at['--backoff-max-s']:g}: the first wait must be at most the longest (defaults 60 and 1800)")
    if at["--hang-s"] < at["--interval-s"]:
        return (f"--hang-s {at['--hang-s']:g} is less than --interval-s {at['--interval-s']:g}: a hang is seen one "
                "probe at a time, so it must be at least one interval (defaults 600 and 30)")
    if values["--probe-timeout-s"] is not None and at["--probe-timeout-s"] > at["--hang-s"]:
        return (f"--probe-timeout-s {at['--probe-timeout-s']:g} is more than --hang-s {at['--hang-s']:g}: one "
                "probe must fit in the time that makes a hang (defaults: 10, or --hang-s when shorter, and 600)")
    return None


def _not_plain_http_url(url: str, parts: SplitResult) -> bool:
    """True unless `url` is http(s) with a host, a port (when given) from 1 to 65535 and no whitespace or control
    characters: what both URL flags the supervisor posts to or reads from need."""
    try:
        port = parts.port  # a port above 65535 or not a number raises
    except ValueError:
        return True
    return (parts.scheme not in ("http", "https") or not parts.hostname or port == 0
            or any(c.isspace() or ord(c) < 32 for c in url))


def check_golden_url(url: str | None) -> str | None:
    """Why `--golden-metrics-url` cannot be used, or None."""
    if not url:
        return None
    try:
        parts = urlsplit(url)
    except ValueError:  # an unclosed IPv6 bracket
        parts = urlsplit("")
    if _not_plain_http_url(url, parts) or "@" in parts.netloc or parts.query or parts.fragment:
        return (f"--golden-metrics-url {masked_url(url)[:120]!r}: want http(s)://HOST:PORT/metrics with a port "
                "from 1 to 65535, the watch unit's --metrics-listen address (no credentials, no query); '' turns "
                "the signal off")
    return None


def check_webhook(url: str | None) -> str | None:
    """Why the alert webhook in VLLM_CLUSTER_ALERT_WEBHOOK cannot be posted to, or None; checked at start so the
    give-up path, which must not fail, never meets it first. Its path and query are never shown (tokens)."""
    if not url:
        return None
    try:
        parts = urlsplit(url)
    except ValueError:  # an unclosed IPv6 bracket
        parts = urlsplit("")
    if _not_plain_http_url(url, parts):
        return (f"{WEBHOOK_ENV} {masked_url(url, keep_path=False)[:120]!r}: want https://HOST[:PORT]/PATH with a "
                "port from 1 to 65535 (path and query not shown); unset it to alert only through the metric")
    return None


SYSTEM_TREES = ("/etc", "/usr", "/boot", "/proc", "/sys", "/dev", "/bin", "/sbin", "/lib", "/lib32", "/lib64",
                "/libx32", "/run/systemd", "/var/lib/dpkg", "/var/lib/systemd")
"""Folders, with everything under them, that a metrics file never belongs in: the unit opens its folder for
writing (ReadWritePaths), which would undo ProtectSystem there."""
SYSTEM_DIRS = ("/", "/var", "/var/lib", "/home", "/root", "/run", "/srv", "/mnt", "/media", "/opt", "/tmp",
               "/var/tmp")
"""Folders (not what is under them) too wide to open for writing."""
METRICS_HEAD = "# HELP vllm_cluster_group_"


def check_metrics_file(flag: str | None, in_unit: bool = False) -> str | None:
    """Why `--metrics-file` cannot be the supervisor's node_exporter textfile, or None: a `*.prom` file in an
    existing folder that is not a system folder, and not another program's file (it is overwritten). In the unit
    (`in_unit`) not under /tmp or /var/tmp either: `PrivateTmp=yes` gives the service its own, which node_exporter
    never reads."""
    if flag is None:
        return None
    shown = f"--metrics-file {flag[:200]!r}"
    want = "want a *.prom file in node_exporter's textfile folder, e.g. /var/lib/node_exporter/textfile/vllm.prom"
    try:
        return _metrics_file_problem(flag, shown, want, in_unit)
    except OSError as exc:  # a name over NAME_MAX or PATH_MAX, a loop of links
        return f"{shown}: cannot be used ({exc.strerror}); {want}"


def _metrics_file_problem(flag: str, shown: str, want: str, in_unit: bool) -> str | None:
    path = Path(flag).resolve()  # a link is judged by where it points
    if not flag.endswith(".prom") or path.suffix != ".prom":
        return f"{shown}: not a *.prom file (node_exporter reads only those); {want}"
    folder = path.parent
    if in_unit and any(str(folder) == t or str(folder).startswith(t + "/") for t in ("/tmp", "/var/tmp")):
        return (f"{shown}: under {str(folder)!r}, which the unit's PrivateTmp=yes replaces with its own (node_exporter "
                f"would never see the file); {want}")
    if not folder.is_dir():
        return f"{shown}: folder {str(folder)!r} does not exist; create it or {want}"
    if str(folder) in SYSTEM_DIRS or any(str(folder) == t or str(folder).startswith(t + "/") for t in SYSTEM_TREES):
        return (f"{shown}: {str(folder)!r} is a system folder (the unit would open it for writing); {want}")
    if path.exists():
        try:
            head = path.read_text(errors="replace")[:len(METRICS_HEAD)] if path.is_file() else None
        except OSError as exc:
            return f"{shown}: cannot be read ({exc.strerror}); {want}"
        if head is None or head not in ("", METRICS_HEAD):
            return (f"{shown}: exists and is not this supervisor's textfile (it would be overwritten); remove it "
                    f"or {want}")
    return None


def check_lock(flag: str | None, stack: str) -> str | None:
    """Why the deploy lock file (`--lock`, else the stack's default) cannot be taken, or None: checked before the
    first node is touched, since a lock that cannot be opened would otherwise end the run half way."""
    path = Path(flag) if flag else lock_path(stack)
    shown = f"--lock {flag!r}" if flag else f"the deploy lock {str(path)!r} (--lock's default)"
    if not path.parent.is_dir():
        return f"{shown}: folder {str(path.parent)!r} does not exist; give --lock a file in an existing folder"
    if path.is_dir():
        return f"{shown}: is a folder; give --lock a file, e.g. /run/lock/vllm-cluster-{stack}.lock"
    if not os.access(path, os.R_OK) if path.exists() else not os.access(path.parent, os.W_OK | os.X_OK):
        return (f"{shown}: this user may not {'open' if path.exists() else 'create'} it; run as the deploying user "
                "or give --lock a file it may write")
    return None


KEY_ENV = "VLLM_API_KEY"


def key_problem(config: StackConfig, stack: str, env_file: str | None = None) -> str | None:
    """Why the golden check could not authenticate, or None: the stack has a key (the `api_key` secret, or proxy
    clients: the check client's key) and VLLM_API_KEY is not set. Checked before anything acts, so a restart never
    stops a serving group and then fails its own check for want of a key."""
    from stacks.planner.plan import check_client

    client = check_client(config)
    if (client is None and config.api_key is None) or os.environ.get(KEY_ENV):
        return None
    whose = f"proxy client {client!r}'s key (proxy_keys.{client})" if client else "the stack's api_key secret"
    where = env_file or f"/etc/vllm-cluster/{stack}-supervisor.env"
    return (f"{KEY_ENV} is not set, and stack {stack!r} needs a key for the golden check: {whose}. Put "
            f"the key in {where} as variable {KEY_ENV} (the unit's EnvironmentFile, mode 0600), or export it for a run "
            "by hand")


def _load(args: argparse.Namespace) -> tuple[StackConfig, Plan, Group]:
    config = load_stack(args.stack, args.set, assume_secret=args.assume_secret)
    plan = build_plan(args.stack, config)
    python = getattr(args, "python", None) or sys.executable
    return config, plan, group_of(plan, golden_argv(plan, config, python))


def mapped_group(group: Group, access: NodeAccess) -> Group:
    """Under the test node map, each rank's shared-memory directory may be a test's own (its `shm_dir`)."""
    if not isinstance(access, MappedAccess):
        return group
    ranks = tuple(replace(r, shm_dir=access.nodes.get(r.node, {}).get("shm_dir", r.shm_dir)) for r in group.ranks)
    return replace(group, ranks=ranks)


def companions_of(plan: Plan, node: str, access: NodeAccess) -> dict[str, str]:
    """The stack's own non-engine containers the plan puts on `node`, by name (as the node map names them) -> role:
    the monitoring containers (components/observability.py) and the proxy (components/api_endpoint.py)."""
    out = {access.container(node, m.name): m.role
           for m in (plan.observability.containers if plan.observability else []) if m.node == node}
    if plan.proxy is not None and plan.proxy.node == node:
        out[access.container(node, plan.proxy.container)] = "api-proxy"
    return out


def ungranted(access: NodeAccess, node: str) -> set[str]:
    """Tests only: the drift kinds a test machine cannot grant a running container (`privileged`, `ulimits` such as
    memlock -1 inside an unprivileged test host), named per node in the node map's `ungranted` (comma-separated);
    over SSH, none."""
    if not isinstance(access, MappedAccess):
        return set()
    return {k for k in access.nodes.get(node, {}).get("ungranted", "").split(",") if k}


def _compared(access: NodeAccess, node: str, spec: ContainerSpec) -> tuple[str, dict[str, Any] | None,
                                                                           str | None, dict[str, Any] | None]:
    """The container's name on the node, its `docker inspect`, the ID and `Config` of its planned image there."""
    name = access.container(node, spec.name)
    found = inspect(access, node, name)
    image = inspect(access, node, spec.image, kind="image")
    image_id = str(image[0]["Id"]) if image else None
    image_config: dict[str, Any] | None = dict(image[0].get("Config") or {}) if image else None
    return name, dict(found[0]) if found else None, image_id, image_config


def monitor_specs(plan: Plan, config: StackConfig, node: str) -> list[ContainerSpec]:
    """The stack's monitoring containers on `node`, as components/observability.py creates them."""
    if plan.observability is None:
        return []
    env = grafana_env(config)
    return [monitor_spec(plan.stack, m, config.observability.data_dir, env)
            for m in plan.observability.containers if m.node == node]


def drift_rows(plan: Plan, access: NodeAccess, config: StackConfig | None = None) -> list[DriftRow]:
    """Every node: its planned containers against `docker inspect`, then the containers it does not own. With
    `config`, the stack's monitoring containers are compared field by field too (informative rows)."""
    rows: list[DriftRow] = []
    for node in plan.nodes:
        own = {access.container(node.name, c.name) for c in node.containers}
        ports = {listener.port for listener in plan.listeners if listener.node == node.name}
        skip = ungranted(access, node.name)
        for spec in node.containers:
            name, found, image_id, image_config = _compared(access, node.name, spec)
            rows += [r for r in compare_container(node.name, spec, found, image_id, image_config, container=name)
                     if r.kind not in skip]
        compared = set()
        for spec in monitor_specs(plan, config, node.name) if config is not None else []:
            name, found, image_id, image_config = _compared(access, node.name, spec)
            rows += [r for r in compare_monitoring(node.name, spec, found, image_id, image_config, container=name)
                     if r.plan.partition(":")[0] not in skip]
            compared.add(name)
        listed = access.docker(node.name, ["ps", "-q", "--no-trunc"], timeout_s=60)
        if listed.returncode != 0:
            raise AccessError(f"node {node.name}: docker ps failed: {listed.stderr.strip()[:300]}")
        ids = listed.stdout.split()
        others = inspect(access, node.name, *ids) if ids else []
        rows += [r for r in foreign_containers(node.name, plan.stack, own, [dict(o) for o in others or []], ports,
                                               companions_of(plan, node.name, access))
                 if not (r.kind == "monitoring" and r.container in compared)]  # its labels row says it already
    return rows


def _drift(args: argparse.Namespace) -> int:
    """Exit 0 no difference or only informative rows (a restart, a relabelled monitoring container), 1 a blocking
    difference, 2 cannot run (a refused stack included); with --json, JSON on stdout on every one of them."""
    try:
        config, plan, _ = _load(args)
    except ConfigError as exc:
        if not args.json:
            raise  # python -m stacks prints the report, exit 2
        print(json.dumps({"stack": args.stack, "error": "the stack is refused",
                          "errors": [p.as_dict() for p in exc.problems]}, indent=2, ensure_ascii=False))
        _say(exc.report())
        return 2
    try:
        rows = drift_rows(plan, access_for(args.stack, config), config)
    except AccessError as exc:
        next_step = "check `ssh` to that node with the stack's pinned key, and that its user may run docker"
        if args.json:  # a caller parsing stdout gets an answer either way
            print(json.dumps({"stack": args.stack, "error": mask_secrets(f"cannot run: {exc}"), "next": next_step},
                             indent=2, ensure_ascii=False))
        _say(f"drift {args.stack}: cannot run: {exc} (next: {next_step})")
        return 2
    blocking = [r for r in rows if r.blocking]
    if args.json:
        print(json.dumps([r.as_dict() for r in rows], indent=2, ensure_ascii=False))
    elif blocking:
        print(table(rows), end="")
        print(f"drift {args.stack}: {len(blocking)} difference(s) between the plan and the nodes"
              f"{f' (and {len(rows) - len(blocking)} for information)' if len(rows) > len(blocking) else ''}; "
              f"`pulumi up -s {args.stack}` after `pulumi refresh` puts back what Pulumi owns, a foreign container is "
              "yours to stop")
    elif rows:
        print(table(rows), end="")
        print(f"drift {args.stack}: only for information ({len(rows)} row(s): restarts, relabelled monitoring "
              "containers); every engine container is what the plan created")
    else:
        print(f"drift {args.stack}: none: every node's containers are what the plan created")
    return 1 if blocking else 0


def ca_file_problem(path: str | None) -> str | None:
    """Why `--ca-file` cannot be the proxy's certificate, or None: checked before anything acts, so a restart
    never stops the old group and then fails its health probe on a typo."""
    if path is None:
        return None
    try:
        pem = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return f"--ca-file {path!r}: no such file; give the proxy's PEM certificate (tls_certificate)"
    except IsADirectoryError:
        return f"--ca-file {path!r}: a directory, not a file; give the proxy's PEM certificate file"
    except PermissionError:
        return f"--ca-file {path!r}: not readable by this user; fix its mode or run as its owner"
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return f"--ca-file {path!r}: cannot be read as text ({type(exc).__name__}); give a PEM certificate file"
    from checks.api import tls_context

    try:
        tls_context(pem)
    except (ValueError, ssl.SSLError) as exc:
        return (f"--ca-file {path!r}: not a PEM certificate ({exc}); give the proxy's certificate, the file that "
                "starts with -----BEGIN CERTIFICATE-----")
    return None


def key_refused(plan: Plan, ca_file: str | None, timeout_s: float = 10.0) -> str | None:
    """Why the serving group refuses VLLM_API_KEY (`GET /v1/models` answers 401 or 403 with it), or None (accepted,
    no key, or no answer: a dead group cannot be asked). Checked before any rank is stopped: a wrong key would
    otherwise make the golden check after the restart fail, and a serving group would have been stopped for it."""
    from heal.supervisor import FETCH_ERRORS, fetch

    key = os.environ.get(KEY_ENV)
    if not key:
        return None
    url = f"{plan.endpoint.rstrip('/')}/v1/models"
    try:
        status, _ = fetch(url, timeout_s, ca_file, limit=64 << 10, headers={"Authorization": f"Bearer {key}"})
    except FETCH_ERRORS:
        return None
    if status not in (401, 403):
        return None
    return (f"{KEY_ENV} (value not shown) is refused by the serving group: GET {masked_url(url)} answered HTTP "
            f"{status}; the golden check after a restart would fail with it. Set {KEY_ENV} to the stack's key (the "
            "api_key secret, or the proxy check client's key in proxy_keys) in the unit's EnvironmentFile")


def _restart_group(args: argparse.Namespace) -> int:
    # the golden check (`python -m checks.api`) runs after the group was stopped, and --ca-file is read by it:
    # an interpreter that cannot import it is refused before anything is read or stopped
    problem = ((needs(CHECKS_WHAT, CHECKS) if args.yes or args.ca_file else None) or ca_file_problem(args.ca_file)
               or (check_lock(args.lock, args.stack) if args.yes else None))
    if problem:
        _say(f"restart-group {args.stack}: {problem}")
        return 2
    config, plan, group = _load(args)
    problem = (key_problem(config, args.stack) or key_refused(plan, args.ca_file)) if args.yes else None
    if problem:
        _say(f"restart-group {args.stack}: {problem}")
        return 2
    print(render_steps(group), end="")
    if not args.yes:
        print(f"dry run: nothing was touched. To act: {STACKS} restart-group {args.stack} --yes")
        return 0
    try:
        access = access_for(args.stack, config)
    except AccessError as exc:
        _say(f"restart-group {args.stack}: {exc}")
        return 2
    group = mapped_group(group, access)
    lock = DeployLock(Path(args.lock) if args.lock else lock_path(args.stack))
    try:
        taken = lock.try_acquire()
    except OSError as exc:
        _say(f"restart-group {args.stack}: --lock {str(lock.path)!r}: cannot be opened ({exc.strerror}); give "
             "--lock a file this user may write in an existing folder")
        return 2
    if not taken:
        _say(f"restart-group {args.stack}: the deploy lock {lock.path} is held (a pulumi up or the supervisor is "
             "working): try again when it is done")
        return 2
    try:
        try:
            blocking = [r for r in drift_rows(plan, access, config) if r.blocking]
        except AccessError as exc:
            _say(f"restart-group {args.stack}: cannot run: {exc}")
            return 2
        if blocking:
            print(table(blocking), end="")
            _say(f"restart-group {args.stack}: refused: the nodes have drifted from the plan (above); a restart "
                 f"would bring that back. Run `pulumi up -s {args.stack}` or undo the hand change")
            return 1
        ok, why = restart_group(group, access, Log(sys.stdout, args.stack), "restart-group by hand",
                                Settings(ca_file=args.ca_file))
    finally:
        lock.release()
    if not ok:
        _say(f"restart-group {args.stack}: FAIL: {why}")
        return 1
    print(f"restart-group {args.stack}: PASS: the group serves again and the golden check passes")
    return 0


def _supervise(args: argparse.Namespace) -> int:
    problem = needs(CHECKS_WHAT, CHECKS) or (needs(CHECKS_WHAT, CHECKS, args.python) if args.python else None)
    if problem:
        _say(f"supervise {args.stack}: {problem}")
        return 2
    from checks.api import parse_listen, serve_metrics

    problem = check_timing(args)
    if problem:
        _say(f"supervise {args.stack}: {problem}")
        return 2
    problem = (check_golden_url(args.golden_metrics_url) or check_metrics_listen(args.metrics_listen)
               or ca_file_problem(args.ca_file) or check_webhook(os.environ.get(WEBHOOK_ENV))
               or check_lock(args.lock, args.stack) or check_metrics_file(args.metrics_file))
    if problem:
        _say(f"supervise {args.stack}: {problem}")
        return 2
    config, plan, group = _load(args)
    listen = metrics_listen(plan, args.metrics_listen)
    problem = (key_problem(config, args.stack) or check_metrics_listen(listen, from_plan=args.metrics_listen is None)
               or key_refused(plan, args.ca_file))
    if problem:
        _say(f"supervise {args.stack}: {problem}")
        return 2
    try:
        access = access_for(args.stack, config)
    except AccessError as exc:
        _say(f"supervise {args.stack}: {exc}")
        return 2
    group = mapped_group(group, access)
    log = Log(sys.stdout, args.stack)
    dp_size, rank_nodes = endpoint_rank_nodes([(n.name, n.dp_ranks, n.role) for n in plan.nodes],
                                              plan.topology.get("load_balancing", "internal"))

    def drift_check() -> list[str]:
        """The blocking rows; AccessError when drift cannot run (the supervisor waits and tries again)."""
        try:
            rows = drift_rows(plan, access, config)
        except ValueError as exc:  # a node answered with something that is not docker's JSON
            raise AccessError(f"unreadable docker inspect output: {exc}") from None
        return [f"{r.node} {r.container} {r.kind}: plan {r.plan}, found {r.found}" for r in rows if r.blocking]

    settings = Settings(interval_s=args.interval_s, hang_s=args.hang_s, backoff_first_s=args.backoff_first_s,
                        backoff_max_s=args.backoff_max_s, max_per_hour=args.max_per_hour, ca_file=args.ca_file,
                        health_timeout_s=args.probe_timeout_s or min(DURATIONS["--probe-timeout-s"], args.hang_s),
                        webhook=os.environ.get(WEBHOOK_ENV) or None,
                        metrics_file=Path(args.metrics_file) if args.metrics_file else None,
                        metrics_url=f"http://{listen}/metrics" if listen else None,
                        golden_url=golden_url(plan, args.golden_metrics_url),
                        golden_max_age_s=args.golden_max_age_s or golden_max_age_s(config, dp_size),
                        golden_ranks={str(i): rank_nodes[i] if rank_nodes else "" for i in range(dp_size)})
    lock = DeployLock(Path(args.lock) if args.lock else lock_path(args.stack))
    supervisor = Supervisor(group, access, log, settings, lock, drift_check)
    if listen:
        try:  # before the first probe: a supervisor that cannot be scraped would look dead to Prometheus
            serve_metrics(parse_listen(listen), supervisor, thread="supervisor-metrics")
        except OSError as exc:
            keys = ("observability.supervisor_address or observability.ports.supervisor" if args.metrics_listen
                    is None else "--metrics-listen")
            _say(f"supervise {args.stack}: --metrics-listen {listen}: cannot listen ({exc.strerror}): run it on the "
                 f"host with that address and a free port, change {keys}, or give --metrics-listen '' to serve "
                 "nothing")
            return 2
    return supervisor.run()


def _supervisor_unit(args: argparse.Namespace) -> int:
    from heal.supervisor_unit import render_supervisor_unit, supervisor_unit_name

    config = load_stack(args.stack, args.set, assume_secret=args.assume_secret)
    plan = build_plan(args.stack, config)  # validated: a supervisor port another listener holds is refused here
    listen = metrics_listen(plan, None)
    python, whose = (args.python, "") if args.python else unit_python(PROJECT_ROOT)
    problem = needs("the unit's `supervise` (its probes and golden check: checks.api)", CHECKS, python)
    if problem:  # the unit would start, fail at its first import and be restarted by systemd for ever
        _say(f"supervisor-unit {args.stack}: {problem}; or give --python the python of a venv that has it")
        return 2
    problem = ((needs(f"checking the metrics address {listen} (checks.api)", CHECKS) if listen else None)
               or workdir_problem(args.workdir) or check_golden_url(args.golden_metrics_url) or check_timing(args)
               or check_metrics_file(args.metrics_file, in_unit=True) or check_metrics_listen(listen, from_plan=True))
    if problem:
        _say(f"supervisor-unit {args.stack}: {problem}")
        return 2
    try:
        name = supervisor_unit_name(args.stack)
        text = render_supervisor_unit(
            stack=args.stack, python=python, workdir=args.workdir or str(PROJECT_ROOT), user=args.user,
            env_file=args.env_file or f"/etc/vllm-cluster/{args.stack}-supervisor.env",
            metrics_file=args.metrics_file, ca_file=args.ca_file, golden_metrics_url=args.golden_metrics_url,
            metrics_listen=listen,
            timing={"--interval-s": args.interval_s, "--hang-s": args.hang_s,
                    "--golden-max-age-s": args.golden_max_age_s})
    except ValueError as exc:
        _say(f"supervisor-unit {args.stack}: {exc}")
        return 2
    if args.user is None:
        _say(f"supervisor-unit {args.stack}: --user is missing: the unit would run as root; give the deploying "
             "user (its ~/.ssh holds the stack's key and pinned known_hosts), or --user root to choose root")
        return 2
    if not (Path(python).is_file() and os.access(python, os.X_OK)):  # systemd would fail at every start
        shown = f"--python {python!r}" if args.python else f"--python's default {python!r} ({whose})"
        _say(f"supervisor-unit {args.stack}: {shown}: no executable file there; give --python, the python of a venv "
             "with this project's requirements (e.g. /opt/vllm-cluster/venv/bin/python)")
        return 2
    print(text, end="")
    print(f"# {name}: save stdout as /etc/systemd/system/{name}, then: systemctl daemon-reload && systemctl "
          f"enable --now {name}\n# the env file: VLLM_API_KEY=… (for the golden check) and {WEBHOOK_ENV}=https://… "
           "(the alert), mode 0600", file=sys.stderr)  # fixed text: nothing to mask
    return 0


def add_commands(sub: Any, add_overrides: Any) -> None:
    """The parsers, added to `python -m stacks`."""
    restart = sub.add_parser("restart-group", help="restart the whole engine group in start order (dry run unless "
                             "--yes)")
    restart.add_argument("stack")
    restart.add_argument("--yes", action="store_true", help="act: stop, clean, start, wait, check")
    restart.add_argument("--lock", default=None,
                         help="the deploy lock file (default /run/lock/vllm-cluster-STACK.lock)")
    restart.add_argument("--ca-file", default=None, help="the proxy's certificate, for the health probe over TLS")
    add_overrides(restart)
    restart.set_defaults(func=_restart_group)
    drift = sub.add_parser("drift", help="compare every node's containers with the plan (exit 0 none or "
                           "informative rows only, 1 drift, 2 cannot run; --json: JSON on every exit)")
    drift.add_argument("stack")
    drift.add_argument("--json", action="store_true")
    add_overrides(drift)
    drift.set_defaults(func=_drift)
    unit = sub.add_parser("supervisor-unit", help="print the systemd service of the group supervisor")
    unit.add_argument("stack")
    for flag, what in (("--python", "interpreter with vllm-cluster[checks] [the project's venv, else this one]"),
                       ("--workdir", "the project the unit runs in (its stack file and cards) [this one]"),
                       ("--user", "the unit's User="), ("--env-file", "the unit's EnvironmentFile= (the API key)"),
                       ("--metrics-file", "where supervise writes its metrics"),
                       ("--ca-file", "the proxy's certificate, for probes over TLS")):
        unit.add_argument(flag, default=None, help=what)
    unit.add_argument("--golden-metrics-url", default=None, help="passed to supervise (default: the plan's watch "
                      "unit address when observability is on)")
    for flag, what in (("--interval-s", "seconds between probes (supervise's default 30)"),
                       ("--hang-s", "health failing this long is a death (default 600)"),
                       ("--golden-max-age-s", "an older golden result is not used (default: three watch rounds "
                        "plus one round's timeouts)")):
        unit.add_argument(flag, type=float, default=None, help=f"passed to supervise: {what}")
    add_overrides(unit)
    unit.set_defaults(func=_supervisor_unit)
    sup = sub.add_parser("supervise", help="run the group supervisor (what the unit starts)")
    sup.add_argument("stack")
    sup.add_argument("--interval-s", type=float, default=30, help="seconds between probes")
    sup.add_argument("--hang-s", type=float, default=600, help="health failing this long is a death (at least "
                     "--interval-s)")
    sup.add_argument("--backoff-first-s", type=float, default=60, help="the wait before the second restart, "
                     "doubling for each next one up to --backoff-max-s (default 60; the first restart is at once)")
    sup.add_argument("--backoff-max-s", type=float, default=1800, help="the longest wait between restarts (default "
                     "1800, at least --backoff-first-s)")
    sup.add_argument("--max-per-hour", type=int, default=4, help="restarts in any hour after which it gives up and "
                     "alerts (1 to 60, default 4)")
    sup.add_argument("--probe-timeout-s", type=float, default=None, help="the health and golden probes' "
                     "deadline (at most --hang-s; default 10, or --hang-s when shorter)")
    sup.add_argument("--metrics-file", default=None, help="node_exporter textfile, e.g. "
                     "/var/lib/node_exporter/textfile/vllm-cluster-STACK.prom")
    sup.add_argument("--metrics-listen", default=None, metavar="ADDRESS:PORT",
                     help="serve the metrics on GET /metrics here (after a give-up it stays up to serve them); "
                     "default: observability.supervisor_address:ports.supervisor when observability is on; '' "
                     "serves nothing")
    sup.add_argument("--lock", default=None, help="the deploy lock file `pulumi up` takes too (default "
                     "/run/lock/vllm-cluster-STACK.lock)")
    sup.add_argument("--ca-file", default=None, help="the proxy's PEM certificate, for the health and golden probes "
                     "over TLS (default: the system's CAs)")
    sup.add_argument("--golden-metrics-url", default=None,
                     help="the watch unit's /metrics (its per-rank golden results); default: where the plan puts "
                     "it when observability is on; '' turns the signal off")
    sup.add_argument("--golden-max-age-s", type=float, default=None,
                     help="an older golden result is not used (default: three watch rounds plus one round's "
                     "timeouts)")
    sup.add_argument("--python", default=None, help=argparse.SUPPRESS)
    add_overrides(sup)
    sup.set_defaults(func=_supervise)

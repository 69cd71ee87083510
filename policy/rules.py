"""The vllm-cluster policy pack's rules, as pure functions over a resource's type, inputs and URN.

The pack runs in its own virtualenv (pulumi_policy only) but from this repository: `policy/__main__.py` puts
the repository root on sys.path, and the rules import the stdlib-only parts of `stacks` that the plan uses
too: argv is read by `stacks.planner.serve_options.read_argv` against `vllm serve`'s and `ray start`'s option tables
(never by matching words), and exposure is `stacks.planner.exposure`, the same rule the plan applies. It reads what the
program registers, never the stack config: engine containers (the ones with a `vllm-cluster.generation` label;
`vllm-cluster.node` names their node), the host firewall's own command (who may connect), and one
`vllm-cluster:index:PolicyFacts` component with the planning facts no process sees (declared private networks,
estimated weight-load time). Those facts once rode on the containers as labels, and a label change replaces a
container; the component restarts nothing.

Rules that need only a container are resource policies (`Analyze`, before the container's step). Rules that join
a container with the facts or the firewall are stack policies: `AnalyzeStack` gets every resource (their outputs;
a component's outputs are what it registers) but runs after the steps (pulumi/pulumi pkg/resource/deploy/
deployment_executor.go: `AnalyzeResources` after `stepExec.WaitForCompletion`). So they block `pulumi preview` and
the preview `pulumi up` runs first; `pulumi up --skip-preview` would report them only afterwards.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from stacks.planner.exposure import (
    API_EXPOSURE_FIX,
    MONITORING_EXPOSURE_FIX,
    UNGUARDED_MONITOR_FIX,
    api_exposed,
    api_exposure_message,
    firewall_file,
    monitoring_exposed,
    monitoring_exposure_message,
    nft_sets,
    sources_for_port,
    trusted_networks,
    unguarded_monitor_problem,
)
from stacks.planner.image_cards import card_for
from stacks.planner.serve_options import (
    ArgvItem,
    last_values,
    option_table,
    ray_start_table,
    read_argv,
    read_serve_argv,
)

CONTAINER = "docker:index/container:Container"
REMOTE_IMAGE = "docker:index/remoteImage:RemoteImage"
REMOTE_COMMAND = "command:remote:Command"
DOCKER_PROVIDER = "pulumi:providers:docker"
FACTS = "vllm-cluster:index:PolicyFacts"
SERVE_FLAGS_VERSION = "0.33.0"
"""The `vllm serve` option table argv is read with (the newest dumped; `--host`, `--port`, `--headless`,
`--data-parallel-address` and `--gpu-memory-utilization` are spelled the same in every image the project knows)."""
LABEL = "vllm-cluster."
MAX_GPU_MEMORY_UTILIZATION = 0.95
_SECRET_SIG = "4dabf18193072939515e22adb298388d"


def _plain(value: Any) -> Any:
    """A secret as the engine's wire form (seen under mocks) is unwrapped; the analyzer already does it."""
    if isinstance(value, Mapping) and _SECRET_SIG in value:
        return _plain(value.get("value"))
    return value


def _labels(props: Mapping[str, Any]) -> dict[str, str]:
    return {str(_plain(x).get("label")): str(_plain(x).get("value")) for x in _plain(props.get("labels")) or []}


def _env(props: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    for item in _plain(props.get("envs")) or []:
        key, _, value = str(_plain(item)).partition("=")
        out[key] = value
    return out


def _shell_commands(script: str) -> list[list[str]]:
    """The simple commands of a start script, one per line (a quoted argument may span lines)."""
    commands: list[list[str]] = []
    pending = ""
    for line in script.splitlines():
        pending = f"{pending}\n{line}" if pending else line
        try:
            words = shlex.split(pending, comments=True)
        except ValueError:  # a quote still open: the command goes on
            continue
        pending = ""
        while words and words[0] == "exec":
            words = words[1:]
        if words:
            commands.append(words)
    return commands


def _commands(props: Mapping[str, Any]) -> list[list[str]]:
    """What the container runs: the image's entrypoint (`vllm serve`) with `command`, `ray <command>`, or each
    command of a `bash -c` start script."""
    entry = [str(_plain(x)) for x in _plain(props.get("entrypoints")) or []]
    command = [str(_plain(x)) for x in _plain(props.get("command")) or []]
    if not entry:
        return [["vllm", "serve", *command]]
    if entry[-1] == "-c" and command:
        return _shell_commands(command[0])
    return [[*entry, *command]]


def serve_argv(props: Mapping[str, Any]) -> list[ArgvItem] | None:
    """The `vllm serve` options, read as vLLM's parser reads them; None when the container runs no vLLM server."""
    for words in _commands(props):
        if words[:2] == ["vllm", "serve"]:
            return read_serve_argv(words[2:], option_table(SERVE_FLAGS_VERSION))
    return None


def ray_argv(props: Mapping[str, Any]) -> list[ArgvItem]:
    """The `ray start` options of the container, if it starts Ray."""
    for words in _commands(props):
        if words[:2] == ["ray", "start"]:
            return read_argv(words[2:], ray_start_table())
    return []


def _values(items: Iterable[ArgvItem], dest: str) -> list[str]:
    """Every value given to `dest` (each occurrence), e.g. every --data-parallel-address."""
    return [v for item in items if item.dest == dest for v in item.values]


def _host_port(address: str) -> str:
    """`host:port` -> host (Ray's --address); an IPv6 literal, bracketed or bare, stays whole."""
    if address.startswith("["):
        return address[1:].split("]", 1)[0]
    return address.rsplit(":", 1)[0] if address.count(":") == 1 else address


def _is_engine(props: Mapping[str, Any]) -> bool:
    return f"{LABEL}generation" in _labels(props)


def _is_private(address: str, declared: list[str]) -> bool:
    host = address.rsplit(":", 1)[0] if address.count(":") == 1 else address
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False  # a name: cannot tell, so not proven private
    if ip.is_unspecified:
        return False
    return ip.is_loopback or ip.is_private or any(ip in ipaddress.ip_network(c, strict=False) for c in declared)


def _api_server(props: Mapping[str, Any]) -> tuple[str, int] | None:
    """(bind, port) of the vLLM API server this container runs, None when it runs none (`--headless`, Ray
    worker). vLLM binds `--host`, or every address without one (vllm/entrypoints/launchers/launcher.py:340-353)."""
    if not _is_engine(props):
        return None
    items = serve_argv(props)
    if items is None:
        return None
    options = last_values(items)
    if "headless" in options:
        return None
    host = (options.get("host") or [""])[-1] or "0.0.0.0"
    port = (options.get("port") or ["8000"])[-1]
    return host, int(port) if port.isdigit() else 8000


def _known_command(words: list[str]) -> bool:
    """A command the program writes into an engine container: `vllm serve`, `ray start`, `set -…`, or the
    Ray cluster-ready wait (`python3 -c` with `ray.init` and no vLLM in it)."""
    if words[:2] in (["vllm", "serve"], ["ray", "start"]):
        return True
    if words[0] == "set":  # errexit, nounset, xtrace, pipefail only (`set -k` would turn argv words into env)
        return len(words) > 1 and all(re.fullmatch(r"-[eux]+o?|pipefail", w) for w in words[1:])
    if words[:2] != ["python3", "-c"] or len(words) != 3:
        return False
    code = words[2]  # the cluster-ready wait: it imports sys, time and ray, and runs nothing
    return ("ray.init(" in code and code.count("import") == 1 and "import sys,time,ray" in code
            and not re.search(r"vllm|\bos\b|subprocess|system|exec|eval|__|open\(|getattr|compile", code, re.I))


def _shell_syntax(script: str) -> str | None:
    """Shell syntax the line-by-line reading cannot follow: `;`, `&`, `|`, redirections, subshells, `$`/backticks
    (substitutions), a line continued with `\\`. None when the script has none (outside quotes)."""
    if re.search(r"\\\n", script):
        return "a line continued with a backslash"
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError as exc:
        return f"unbalanced quoting ({exc})"
    for token in tokens:
        if token and set(token) <= set("();<>|&"):
            return f"shell operator {token!r}"
        if "$" in token or "`" in token:
            return f"a substitution in {token[:40]!r}"
    return None


def engine_command_readable(props: Mapping[str, Any]) -> list[str]:
    """The other rules read an engine's argv; a command they cannot read (`env A=1 vllm serve`, `python3 -m
    vllm…`, `true && vllm serve`) would pass them unread. Fail closed: an engine runs only commands read here."""
    if not _is_engine(props):
        return []
    entry = [str(_plain(x)) for x in _plain(props.get("entrypoints")) or []]
    command = [str(_plain(x)) for x in _plain(props.get("command")) or []]
    if entry and entry[-1] == "-c" and command:
        syntax = _shell_syntax(command[0])
        if syntax:
            return [f"engine container's start script uses {syntax}: the policy reads one simple command per "
                    "line, so it cannot tell what runs; the program writes none of that"]
    commands = _commands(props)
    unknown = [" ".join(words)[:80] for words in commands if not _known_command(words)]
    if unknown:
        return [f"engine container runs a command the policy cannot read: {unknown[0]!r}; the program writes "
                "`vllm serve …`, `ray start …` and the cluster-ready wait, each as its own line"]
    if not any(words[:2] in (["vllm", "serve"], ["ray", "start"]) for words in commands):
        return ["engine container runs neither `vllm serve` nor `ray start`: the policy cannot read its bind"]
    return []


def api_auth(props: Mapping[str, Any]) -> list[str]:
    """vLLM's API on a non-loopback address must have a key (its own `VLLM_API_KEY`)."""
    server = _api_server(props)
    if server is None:
        return []
    host = server[0]
    try:
        exposed = host in ("0.0.0.0", "::") or not ipaddress.ip_address(host).is_loopback
    except ValueError:
        exposed = True  # a name: vLLM resolves it; it cannot be shown to be loopback
    if exposed and "VLLM_API_KEY" not in _env(props):
        return [f"vLLM's API listens on {host} without a key: set the api_key secret, or turn on api.proxy "
                "(vLLM then binds 127.0.0.1)"]
    return []


def _facts_networks(facts: Mapping[str, Any] | None) -> list[str]:
    """The stack's declared private networks, from its PolicyFacts component (none without one)."""
    return [str(_plain(c)) for c in _plain((facts or {}).get("privateNetworks")) or []]


def _facts_of(resources: Iterable[tuple[str, str, Mapping[str, Any]]]) -> Mapping[str, Any] | None:
    return next((props for typ, _, props in resources if typ == FACTS), None)


def api_exposure(resources: list[tuple[str, str, Mapping[str, Any]]]) -> list[tuple[str, str]]:
    """`stacks.planner.exposure` rule 1 over the whole stack: (resource name, message) for each engine whose vLLM API
    port is reachable from outside the private networks, read from its `--host`/`--port`, its node's declared
    private networks and what that node's host firewall command (`<node>-firewall`) really applies; no
    firewall resource means nothing filters. Whatever the key: vLLM's key guards only /v1 paths."""
    firewalls = {name: str(_plain(props.get("create")) or "") for typ, name, props in resources
                 if typ == REMOTE_COMMAND and name.endswith("-firewall")}
    facts = _facts_of(resources)
    found = []
    for typ, name, props in resources:
        server = _api_server(props) if typ == CONTAINER else None
        if server is None:
            continue
        bind, port = server
        node = _labels(props).get(f"{LABEL}node", "")
        text = firewall_file(firewalls[f"{node}-firewall"]) if f"{node}-firewall" in firewalls else None
        allowed, cluster = sources_for_port(nft_sets(text) if text is not None else None, port)
        private = trusted_networks(_facts_networks(facts))
        try:
            exposed = api_exposed(bind, allowed, [*cluster, *private], private)
        except ValueError:  # a host name as --host: cannot be shown private
            exposed = True
        if exposed:
            found.append((name, f"{api_exposure_message(bind, port, allowed)}; fix: {API_EXPOSURE_FIX}"))
    return found


MONITOR_LISTENS: dict[str, tuple[tuple[str, int], ...]] = {
    "node-exporter": (("--web.listen-address", 9100),), "dcgm-exporter": (("--address", 9400),),
    "prometheus": (("--web.listen-address", 9090),),
    "alertmanager": (("--web.listen-address", 9093), ("--cluster.listen-address", 9094))}
"""Each monitoring role's listen flags and the port it takes without one (every address then: these programs'
documented defaults), so a flag the policy cannot find is judged as the wildcard it would be. Grafana's are its
GF_SERVER_HTTP_ADDR / GF_SERVER_HTTP_PORT variables (all addresses, 3000)."""


def _flag(argv: list[str], flag: str) -> str | None:
    """The last value of `flag=V` or `flag V` in `argv`; None without one."""
    found = None
    for i, word in enumerate(argv):
        if word.startswith(flag + "="):
            found = word.split("=", 1)[1]
        elif word == flag and i + 1 < len(argv):
            found = argv[i + 1]
    return found


def _listen(value: str | None, port: int) -> tuple[str, int]:
    """`HOST:PORT`, `[V6]:PORT` or `:PORT` -> (bind, port); an empty host is every address."""
    if not value:
        return "0.0.0.0", port
    host, _, text = value.rpartition(":")
    if not host and "[" not in value and value.count(":") == 0:
        return value, port
    return host.strip("[]") or "0.0.0.0", int(text) if text.isdigit() else port


def monitor_listeners(role: str, props: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(bind, port) of every socket a monitoring container of `role` listens on, read from what it runs."""
    if role == "grafana":
        env = _env(props)
        port = env.get("GF_SERVER_HTTP_PORT", "3000")
        return [(env.get("GF_SERVER_HTTP_ADDR") or "0.0.0.0", int(port) if port.isdigit() else 3000)]
    argv = [str(w) for w in _plain(props.get("command")) or []]
    return [_listen(_flag(argv, flag), port) for flag, port in MONITOR_LISTENS.get(role, ())]


def monitoring_exposure(resources: list[tuple[str, str, Mapping[str, Any]]]) -> list[tuple[str, str]]:
    """`stacks.planner.exposure` rule 3 over the whole stack, as the plan applies it: each monitoring container
    (`vllm-cluster.role` an exporter, Prometheus, Grafana or Alertmanager; its node from its resource name
    `observability-<node>-<role>`) whose listener its node's host firewall (`<node>-firewall`; none: nothing
    filters) lets a source outside the private networks reach (`monitoring_exposed`), and each watch unit or
    supervisor address on a host no firewall guards (PolicyFacts `unguardedMonitors`) in public space outside
    them (`unguarded_monitor_problem`)."""
    firewalls = {name: str(_plain(props.get("create")) or "") for typ, name, props in resources
                 if typ == REMOTE_COMMAND and name.endswith("-firewall")}
    facts = _facts_of(resources)
    private = trusted_networks(_facts_networks(facts))
    found = []
    for typ, name, props in resources:
        role = _labels(props).get(f"{LABEL}role", "") if typ == CONTAINER else ""
        if role not in (*MONITOR_LISTENS, "grafana"):
            continue
        node = name.removeprefix("observability-").removesuffix(f"-{role}")
        text = firewall_file(firewalls[f"{node}-firewall"]) if f"{node}-firewall" in firewalls else None
        sets = nft_sets(text) if text is not None else None
        exposed = []
        for bind, port in monitor_listeners(role, props):
            allowed, cluster = sources_for_port(sets, port)
            try:
                reachable = monitoring_exposed(bind, allowed, [*cluster, *private], private)
            except ValueError:  # a host name: cannot be shown private
                reachable = True
            if reachable:
                exposed.append(f"{node} ({bind}:{port})")
        if exposed:
            found.append((name, f"{monitoring_exposure_message(exposed)}; fix: {MONITORING_EXPOSURE_FIX}"))
    facts_name = next((n for t, n, _ in resources if t == FACTS), "")
    for entry in _plain((facts or {}).get("unguardedMonitors")) or []:
        entry = _plain(entry) if isinstance(_plain(entry), Mapping) else {"address": entry}
        key, address, port = str(entry.get("key")), str(entry.get("address")), int(entry.get("port") or 0)
        try:
            problem = unguarded_monitor_problem(key, address, port, private)
        except ValueError:  # not an address: cannot be shown private
            problem = f"{address!r} is not an IP address: it cannot be shown to be private"
        if problem:
            found.append((facts_name, f"{key} {address}: {problem}; fix: {UNGUARDED_MONITOR_FIX}"))
    return found


def internal_ports_private(props: Mapping[str, Any], facts: Mapping[str, Any] | None) -> list[str]:
    """DP RPC, VLLM_HOST_IP (torch.distributed, ZMQ) and Ray must bind private or declared-private addresses.

    `facts` is the PolicyFacts component's properties (None when the stack has none: only loopback and RFC 1918 /
    ULA ranges count as private then)."""
    if not _is_engine(props):
        return []
    declared = trusted_networks(_facts_networks(facts))
    serve, ray = serve_argv(props) or [], ray_argv(props)
    found = [("VLLM_HOST_IP", a) for a in [_env(props).get("VLLM_HOST_IP", "")] if a]
    found += [("DP coordinator RPC", a) for a in _values(serve, "data_parallel_address")]
    for dest, what in (("node_ip_address", "Ray node"), ("address", "Ray GCS"),
                       ("dashboard_host", "Ray dashboard/jobs")):
        found += [(what, _host_port(a) if dest == "address" else a) for a in _values(ray, dest)]
    missing = "" if facts is not None else f" (no {FACTS} resource in the stack: no declared networks were read)"
    return [f"{what} on {address}: unauthenticated and able to run code, so it must be on loopback or a private "
            f"network (declare the stack's own in fabric.private_networks){missing}"
            for what, address in found if not _is_private(address, declared)]


def gpu_memory_utilization(props: Mapping[str, Any]) -> list[str]:
    if not _is_engine(props):
        return []
    values = _values(serve_argv(props) or [], "gpu_memory_utilization")
    return [f"--gpu-memory-utilization {v} leaves no headroom for NCCL and CUDA graphs: at most "
            f"{MAX_GPU_MEMORY_UTILIZATION}" for v in values if _float(v) > MAX_GPU_MEMORY_UTILIZATION]


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("inf")  # not a number vLLM would accept either: never below the limit


def engine_ready_timeout(props: Mapping[str, Any], facts: Mapping[str, Any] | None) -> list[str]:
    """The engine-ready timeout in the container's env against the PolicyFacts load estimate."""
    if not _is_engine(props) or facts is None:
        return []
    estimate = _plain(facts.get("estimatedLoadS"))
    timeout = _env(props).get("VLLM_ENGINE_READY_TIMEOUT_S")
    if estimate is None or timeout is None or not timeout.isdigit() or int(timeout) >= int(estimate):
        return []
    return [f"VLLM_ENGINE_READY_TIMEOUT_S {timeout} is below the estimated weight-load time of {int(estimate)}s: "
            "the API server would exit while the engines still load; raise serving.engine_ready_timeout_s"]


_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def image_pinned(props: Mapping[str, Any]) -> list[str]:
    name = str(_plain(props.get("name")) or "")
    if _DIGEST.search(name):
        return []
    return [f"image {name} is not pinned by digest: a tag can be re-pushed; write repo:tag@sha256:<digest>"]


def image_carded(props: Mapping[str, Any]) -> list[str]:
    """The image has a card in images/ (stacks/planner/image_cards.py, the planner's matching rule): without one
    no flag or extra_args value was checked offline against the image's own vLLM."""
    name = str(_plain(props.get("name")) or "")
    repo_tag, _, digest = name.partition("@")
    card, why = card_for(repo_tag, digest or None)
    if card is not None:
        return []
    return [f"image {name} has no image card ({why or 'no card in images/ describes it'}): its vLLM flags were not "
            f"checked offline; run `python -m stacks image-card {repo_tag}` and commit images/"]


def _ssh_options(words: list[str]) -> dict[str, str]:
    """`-o Key=value` / `-oKey=value` pairs of an ssh argv, keys lower-cased; ssh keeps the first of each."""
    out: dict[str, str] = {}
    for i, word in enumerate(words):
        value = words[i + 1] if word == "-o" and i + 1 < len(words) else word[2:] if word.startswith("-o") else None
        if value:
            key, _, setting = value.replace(" ", "=", 1).partition("=")
            out.setdefault(key.strip().lower(), setting.strip())
    return out


def host_key_pinned(props: Mapping[str, Any]) -> list[str]:
    """Every SSH connection verifies the node's host key: remote commands carry `connection.hostKey`, a Docker
    provider over ssh:// refuses unknown or changed keys from a file of its own."""
    if "connection" in props:
        connection = _plain(props.get("connection")) or {}
        if not _plain(connection.get("hostKey")):
            host = _plain(connection.get("host"))
            return [f"the remote command's SSH connection to {host} accepts any host key: whoever answers on the path "
                    "can run it and report PASS; set nodes[].ssh.host_key (ssh-keyscan -t ed25519 <host>)"]
        return []
    host = str(_plain(props.get("host")) or "")
    if not host.startswith("ssh://"):
        return []
    raw = _plain(props.get("sshOpts")) or []
    if isinstance(raw, str):  # provider inputs reach the engine JSON-encoded (pulumi ProviderResource)
        try:
            raw = json.loads(raw)
        except ValueError:
            raw = raw.split()
    options = _ssh_options([str(_plain(w)) for w in raw])
    missing = [want for want, ok in (
        ("StrictHostKeyChecking=yes", options.get("stricthostkeychecking", "").lower() == "yes"),
        ("UserKnownHostsFile=<the stack's file>", options.get("userknownhostsfile", "") not in ("", "/dev/null")),
        ("GlobalKnownHostsFile=/dev/null", options.get("globalknownhostsfile") == "/dev/null"),
    ) if not ok]
    if missing:
        return [f"the Docker provider for {host} does not pin the node's host key (missing {', '.join(missing)}): "
                "set nodes[].ssh.host_key (ssh-keyscan -t ed25519 <host>)"]
    return []


def stack_of(urn: str) -> str:
    """`urn:pulumi:<stack>::<project>::…`."""
    return urn.split(":", 3)[2].split("::", 1)[0] if urn.startswith("urn:pulumi:") else ""


def _validator(rule: Callable[[Mapping[str, Any]], list[str]], resource_type: str | tuple[str, ...],
               stacks_from_config: bool = False) -> Callable[[ResourceValidationArgs, ReportViolation], None]:
    types = (resource_type,) if isinstance(resource_type, str) else resource_type

    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        if args.resource_type not in types:
            return
        if stacks_from_config and stack_of(args.urn) not in list(args.get_config().get("stacks", ["prod"])):
            return
        for message in rule(args.props):
            report_violation(message, None)
    return validate


ENGINE_IMAGE_URN = "vllm-cluster:index:GpuNode$" + REMOTE_IMAGE
"""The engine image is pulled by a GpuNode (components/gpu_node.py); the front door's nginx and the monitoring
images are other components' and have no vLLM to card."""


def _engine_image_validator(rule: Callable[[Mapping[str, Any]], list[str]], stacks_from_config: bool = False
                            ) -> Callable[[ResourceValidationArgs, ReportViolation], None]:
    inner = _validator(rule, REMOTE_IMAGE, stacks_from_config)

    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        if f"::{ENGINE_IMAGE_URN}::" in args.urn:
            inner(args, report_violation)
    return validate


def _stack_validator(rule: Callable[[list[tuple[str, str, Mapping[str, Any]]]], list[tuple[str, str]]]
                     ) -> Callable[[StackValidationArgs, ReportViolation], None]:
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        urns = {r.name: r.urn for r in args.resources}
        for name, message in rule([(r.resource_type, r.name, r.props) for r in args.resources]):
            report_violation(message, urns.get(name))
    return validate


def _facts_validator(rule: Callable[[Mapping[str, Any], Mapping[str, Any] | None], list[str]]
                     ) -> Callable[[StackValidationArgs, ReportViolation], None]:
    """Every container of the stack against the stack's PolicyFacts; each violation names its container."""
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        facts = next((r.props for r in args.resources if r.resource_type == FACTS), None)
        for resource in args.resources:
            if resource.resource_type != CONTAINER:
                continue
            for message in rule(resource.props, facts):
                report_violation(message, resource.urn)
    return validate


_STACKS_CONFIG = PolicyConfigSchema(properties={"stacks": {"type": "array", "items": {"type": "string"},
                                                           "default": ["prod"]}})
SSH_TYPES = (REMOTE_COMMAND, DOCKER_PROVIDER)

POLICIES: list[ResourceValidationPolicy | StackValidationPolicy] = [
    StackValidationPolicy(
        name="vllm-api-not-public",
        description="vLLM's own API port not reachable from outside the private networks, whatever its key "
                    "(stacks/planner/exposure.py, the plan's rule)",
        enforcement_level=EnforcementLevel.MANDATORY, validate=_stack_validator(api_exposure)),
    StackValidationPolicy(
        name="monitoring-not-public",
        description="the unauthenticated monitoring listeners (exporters, Prometheus, Grafana, Alertmanager, the "
                    "watch unit and the group supervisor) not reachable from outside the private networks "
                    "(stacks/planner/exposure.py, the plan's rule)",
        enforcement_level=EnforcementLevel.MANDATORY, validate=_stack_validator(monitoring_exposure)),
    ResourceValidationPolicy(
        name="vllm-engine-command-readable", description="an engine container runs only commands the policy "
        "reads (vllm serve, ray start, the cluster-ready wait): the other rules fail closed",
        enforcement_level=EnforcementLevel.MANDATORY, validate=_validator(engine_command_readable, CONTAINER)),
    ResourceValidationPolicy(
        name="vllm-api-auth-on-non-loopback", description="vLLM's API off loopback needs a key",
        enforcement_level=EnforcementLevel.MANDATORY, validate=_validator(api_auth, CONTAINER)),
    StackValidationPolicy(
        name="vllm-internal-ports-private",
        description="DP RPC, VLLM_HOST_IP and Ray only on loopback, private or declared-private addresses",
        enforcement_level=EnforcementLevel.MANDATORY, validate=_facts_validator(internal_ports_private)),
    ResourceValidationPolicy(
        name="vllm-gpu-memory-utilization", description=f"--gpu-memory-utilization <= {MAX_GPU_MEMORY_UTILIZATION}",
        enforcement_level=EnforcementLevel.MANDATORY, validate=_validator(gpu_memory_utilization, CONTAINER)),
    StackValidationPolicy(
        name="vllm-engine-ready-timeout", description="engine-ready timeout >= the estimated weight-load time",
        enforcement_level=EnforcementLevel.MANDATORY, validate=_facts_validator(engine_ready_timeout)),
    ResourceValidationPolicy(
        name="image-pinned-by-digest", description="images pulled by digest (advice everywhere)",
        enforcement_level=EnforcementLevel.ADVISORY, validate=_validator(image_pinned, REMOTE_IMAGE)),
    ResourceValidationPolicy(
        name="prod-image-pinned-by-digest", description="images pulled by digest in the listed stacks (prod)",
        enforcement_level=EnforcementLevel.MANDATORY,
        validate=_validator(image_pinned, REMOTE_IMAGE, stacks_from_config=True), config_schema=_STACKS_CONFIG),
    ResourceValidationPolicy(
        name="image-has-card", description="the engine image has an image card in images/ (advice everywhere)",
        enforcement_level=EnforcementLevel.ADVISORY, validate=_engine_image_validator(image_carded)),
    ResourceValidationPolicy(
        name="prod-image-has-card", description="the engine image has an image card in the listed stacks (prod): "
        "no engine whose flags were not checked offline", enforcement_level=EnforcementLevel.MANDATORY,
        validate=_engine_image_validator(image_carded, stacks_from_config=True), config_schema=_STACKS_CONFIG),
    ResourceValidationPolicy(
        name="ssh-host-key-pinned", description="SSH to the nodes verifies their host keys (advice everywhere)",
        enforcement_level=EnforcementLevel.ADVISORY, validate=_validator(host_key_pinned, SSH_TYPES)),
    ResourceValidationPolicy(
        name="prod-ssh-host-key-pinned", description="SSH to the nodes verifies their host keys in the listed "
        "stacks (prod)", enforcement_level=EnforcementLevel.MANDATORY,
        validate=_validator(host_key_pinned, SSH_TYPES, stacks_from_config=True), config_schema=_STACKS_CONFIG),
]

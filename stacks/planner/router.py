"""The vllm-router in front of disaggregated prefill/decode groups: its pinned release, its command line and its
container, rendered from the groups' API addresses. Pure: no I/O, no Pulumi.

The router is vllm-router 0.1.17 from PyPI (`ROUTER_WHEEL`, sha256 pinned; its source is the sdist of the same
release, cited below as `src/...`). Its P/D mode (`--vllm-pd-disaggregation`) takes each prefill API server as
`--prefill URL` and each decode as `--decode URL` (`py_src/vllm_router/router_args.py:286-300`); for every request
it picks a prefill and a decode with its policies, sends the prefill the request with `max_tokens: 1` and
`kv_transfer_params: {do_remote_decode: true}`, then the decode the client's request with the `kv_transfer_params`
the prefill returned (`src/routers/http/vllm_pd_router.rs:1613-1975`). A prefill's optional second word is a
bootstrap port, used by the Mooncake connector only (`vllm_pd_router.rs:2559-2566`); with NIXL (`--kv-connector
nixl`, the default) it is left out.

What this module decides, and why:

- The router authenticates no client: the wheel's launcher has no flag for `api_key_validation_urls`
  (`py_src/vllm_router/router_args.py`), which stays empty (`src/lib.rs:319`). So it listens on loopback or a
  private address behind the front door, never on a wildcard or public address.
- It calls the instances with `Authorization: Bearer $OPENAI_API_KEY` from its own environment, whatever the client
  sent (`vllm_pd_router.rs:1760-1768`, `1920-1929`): the container gets the stack's `api_key` secret as
  `OPENAI_API_KEY`, never `--api-key` on the command line (argv is readable in `ps` and `docker inspect`).
- Policies: `cache_aware` (the router's default), `round_robin`, `random` and `consistent_hash`. `power_of_two`
  is refused: it polls each worker's `/get_load` (`src/routers/http/pd_router.rs:1219`), which vLLM 0.33.0 does not
  serve, so every load reads the same and it is random with extra requests. `kv_aware` needs KV event sources
  (`--pd-kv-events`, `src/config/validation.rs:935-955`) this program does not wire; `sticky_least_loaded` pins
  sessions by an id and a finish call the stack's clients do not send (`src/policies/sticky_least_loaded.rs:1-23`).
- Its Prometheus endpoint (`--prometheus-host/--prometheus-port`, default 127.0.0.1:29000) carries
  `vllm_router_pd_prefill_requests_total{worker}` and `vllm_router_pd_decode_requests_total{worker}`
  (`src/metrics.rs:204-235`, `1020-1083`): checks/pd.py reads them to learn which decode served a request.
- The container runs the wheel from a read-only folder on the host (`ROUTER_MOUNT`, the wheel unpacked after its
  sha256 is checked) with the vLLM image's own Python: vLLM 0.33.0 requires every package the router's launcher
  imports (fastapi, uvicorn, aiohttp, orjson, setproctitle, requests: the wheel's METADATA against vLLM's), and the
  wheel is abi3 / manylinux_2_28.
"""

from __future__ import annotations

import ipaddress
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from stacks.model.errors import Problem
from stacks.model.field_types import host_port, is_hostname, is_ip_literal
from stacks.model.kv_transfer_config import REFUSED_ROUTER_POLICIES, ROUTER_POLICIES
from stacks.model.kv_transfer_config import ROUTER_WHEEL_URL as ROUTER_WHEEL_URL  # where the wheel is fetched
from stacks.planner.container_spec import LABEL_PREFIX, ContainerSpec, HealthcheckSpec, VolumeSpec

ROUTER_PACKAGE = "vllm-router"
ROUTER_VERSION = "0.1.17"
ROUTER_WHEEL = "vllm_router-0.1.17-cp38-abi3-manylinux_2_28_x86_64.whl"
ROUTER_WHEEL_SHA256 = "85c96bea4d573a49b5a8ae4c72ee3dfe733aba26b6f1ff1256e6142f1f42694d"
ROUTER_SDIST_SHA256 = "6c37f9a8fb71ba3bda307f6a8a82792c0da86526dcddc97a81928929c4457d9d"
"""vllm_router-0.1.17.tar.gz: the source every `src/...` citation here and in checks/pd.py reads."""
ROUTER_HOST_DIR = f"/var/lib/vllm-cluster/{ROUTER_PACKAGE}-{ROUTER_VERSION}"
ROUTER_RESOURCE = "router"
"""The router container's resource name in the program (components/pd_router.py), which the review tools read."""
"""Where the head keeps the unpacked wheel (`wheel_install_script`), mounted read-only into the router."""
ROUTER_MOUNT = "/opt/vllm-router"
"""Where the unpacked wheel is mounted, read-only, and put on PYTHONPATH."""
POLICIES = ROUTER_POLICIES
REFUSED_POLICIES = REFUSED_ROUTER_POLICIES
ROUTER_POLICY_CHOICES = (*POLICIES, *REFUSED_POLICIES)
"""Every value the router's --policy accepts (py_src/vllm_router/router_args.py, `--policy` choices)."""
MAX_INSTANCES = 64
MAX_TIMEOUT_S = 7 * 86_400


@dataclass(frozen=True)
class RouterSpec:
    """What the router is given: the instances' API base URLs (http://host:port), its policies and where it listens."""

    prefill_urls: tuple[str, ...]
    decode_urls: tuple[str, ...]
    host: str
    port: int
    policy: str = "cache_aware"
    prefill_policy: str | None = None
    decode_policy: str | None = None
    prometheus_host: str = "127.0.0.1"
    prometheus_port: int = 29000
    worker_startup_timeout_s: int = 3600
    """The router refuses to start until every instance answers /health (src/routers/http/router.rs:991-1075): the
    weights' load time."""
    worker_startup_check_interval_s: int = 5
    """Seconds between those /health rounds (the router's default is 30)."""
    request_timeout_s: int = 1800
    health_check_interval_s: int = 10
    extra_labels: dict[str, str] = field(default_factory=dict)


def _url_problem(key: str, url: object) -> Problem | None:
    """An instance URL must be http://host:port and nothing else: it becomes one argv word of the router and the
    base every request path is appended to."""
    fix = "http://HOST:PORT of the instance's API server, e.g. http://10.30.8.2:8000"
    if not isinstance(url, str) or not url or len(url) > 300 or any(c.isspace() or ord(c) < 32 for c in url):
        return Problem(key, url, "not a URL on one line", fix=fix)
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        return Problem(key, url, "its port is not a number 1-65535", fix=fix)
    if parts.scheme != "http":
        return Problem(key, url, "the router reaches instances over http:// on the cluster network (vLLM serves "
                       "plain HTTP; TLS ends at the front door)", fix=fix)
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        return Problem(key, url, "carries credentials; the router sends the stack's api_key itself", fix=fix)
    if parts.path not in ("", "/") or parts.query or parts.fragment or url.endswith(("?", "#")):
        return Problem(key, url, "has a path, query or fragment: the router appends /v1/... to the base", fix=fix)
    host = parts.hostname or ""
    if not (is_hostname(host) or is_ip_literal(host)) or not port:
        return Problem(key, url, "needs a host (an IP address or a host name) and an explicit port", fix=fix)
    if is_ip_literal(host) and (ipaddress.ip_address(host).is_unspecified or ipaddress.ip_address(host).is_multicast):
        return Problem(key, url, "names no one host (unspecified or multicast)", fix=fix)
    return None


def _listen_problem(key: str, host: object, public_ok: bool = False) -> Problem | None:
    fix = "127.0.0.1, or the head's private cluster address (the front door proxies to it)"
    if not isinstance(host, str) or not is_ip_literal(host):
        return Problem(key, host, "not an IP address to bind", fix=fix)
    address = ipaddress.ip_address(host)
    if address.is_unspecified:
        return Problem(key, host, "binds every address: the router checks no client key, so anyone who reaches the "
                       "port uses the model without one", fix=fix)
    if not public_ok and not (address.is_loopback or address.is_private):
        return Problem(key, host, "is a public address: the router checks no client key", fix=fix)
    if address.is_multicast:
        return Problem(key, host, "is a multicast address", fix=fix)
    return None


def _port_problem(key: str, port: object) -> Problem | None:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        return Problem(key, port, "not a TCP port", fix="1-65535, e.g. 8090")
    return None


def _policy_problem(key: str, policy: object) -> Problem | None:
    if policy in POLICIES:
        return None
    if isinstance(policy, str) and policy in REFUSED_POLICIES:
        return Problem(key, policy, "not used with vLLM 0.33.0 here", upstream=REFUSED_POLICIES[policy],
                       fix=f"one of {', '.join(POLICIES)}")
    return Problem(key, policy, "not a router policy", fix=f"one of {', '.join(POLICIES)}")


def router_problems(spec: RouterSpec, key: str = "router") -> list[Problem]:
    """Everything wrong with `spec`, all at once; empty when the router can be rendered."""
    problems: list[Problem] = []
    for side, urls in (("prefill_urls", spec.prefill_urls), ("decode_urls", spec.decode_urls)):
        if not urls:
            problems.append(Problem(f"{key}.{side}", list(urls), f"no {side.split('_')[0]} instance",
                                    fix="at least one http://HOST:PORT"))
        if len(urls) > MAX_INSTANCES:
            problems.append(Problem(f"{key}.{side}", len(urls), "too many instances",
                                    fix=f"at most {MAX_INSTANCES}"))
        problems += [p for i, url in enumerate(urls[:MAX_INSTANCES]) if (p := _url_problem(f"{key}.{side}.{i}", url))]
    seen: dict[str, str] = {}
    for side, urls in (("prefill_urls", spec.prefill_urls), ("decode_urls", spec.decode_urls)):
        for i, url in enumerate(urls[:MAX_INSTANCES]):
            if not isinstance(url, str):
                continue
            base = url.rstrip("/").lower()
            if base in seen:
                problems.append(Problem(f"{key}.{side}.{i}", url, f"is also {seen[base]}: an instance is either a "
                                        "prefill or a decode, once", fix="list each API server once"))
            seen.setdefault(base, f"{key}.{side}.{i}")
    problems += [p for p in (
        _listen_problem(f"{key}.host", spec.host),
        _port_problem(f"{key}.port", spec.port),
        _listen_problem(f"{key}.prometheus_host", spec.prometheus_host),
        _port_problem(f"{key}.prometheus_port", spec.prometheus_port),
        _policy_problem(f"{key}.policy", spec.policy),
        *(_policy_problem(f"{key}.{name}", value)
          for name, value in (("prefill_policy", spec.prefill_policy), ("decode_policy", spec.decode_policy))
          if value is not None),
    ) if p]
    if spec.host == spec.prometheus_host and spec.port == spec.prometheus_port:
        problems.append(Problem(f"{key}.prometheus_port", spec.prometheus_port, "is the router's own port",
                                fix="another port, e.g. 29000"))
    for name, value, low in (("worker_startup_timeout_s", spec.worker_startup_timeout_s, 1),
                             ("worker_startup_check_interval_s", spec.worker_startup_check_interval_s, 1),
                             ("request_timeout_s", spec.request_timeout_s, 1),
                             ("health_check_interval_s", spec.health_check_interval_s, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_TIMEOUT_S:
            problems.append(Problem(f"{key}.{name}", value, "not a number of seconds",
                                    fix=f"{low}-{MAX_TIMEOUT_S}"))
    return problems


def router_args(spec: RouterSpec) -> list[str]:
    """The router's arguments (after the program name), for a spec `router_problems` found nothing wrong with."""
    problems = router_problems(spec)
    if problems:
        raise ValueError("; ".join(p.render() for p in problems))
    args = ["--vllm-pd-disaggregation", "--kv-connector", "nixl"]
    for url in spec.prefill_urls:
        args += ["--prefill", url.rstrip("/")]
    for url in spec.decode_urls:
        args += ["--decode", url.rstrip("/")]
    args += ["--policy", spec.policy]
    if spec.prefill_policy:
        args += ["--prefill-policy", spec.prefill_policy]
    if spec.decode_policy:
        args += ["--decode-policy", spec.decode_policy]
    args += ["--host", spec.host, "--port", str(spec.port),
             "--prometheus-host", spec.prometheus_host, "--prometheus-port", str(spec.prometheus_port),
             "--worker-startup-timeout-secs", str(spec.worker_startup_timeout_s),
             "--worker-startup-check-interval", str(spec.worker_startup_check_interval_s),
             "--request-timeout-secs", str(spec.request_timeout_s),
             "--health-check-interval-secs", str(spec.health_check_interval_s),
             "--log-level", "info"]
    return args


def router_argv(spec: RouterSpec, program: Sequence[str] = ("vllm-router",)) -> list[str]:
    """The whole command line: `vllm-router` (the wheel's console script) or another way to start it."""
    return [*program, *router_args(spec)]


def router_url(spec: RouterSpec) -> str:
    """Where clients (the front door) reach the router."""
    return f"http://{host_port(spec.host, spec.port)}"


def router_metrics_url(spec: RouterSpec) -> str:
    return f"http://{host_port(spec.prometheus_host, spec.prometheus_port)}"


def router_container(spec: RouterSpec, name: str, image: str, wheel_dir: str, stack: str) -> ContainerSpec:
    """The router's container: the stack's vLLM image (it has every package the launcher imports), the unpacked
    pinned wheel mounted read-only from `wheel_dir` on the host, host networking, the stack's `api_key` as
    OPENAI_API_KEY (what the router sends the instances)."""
    health = f"import urllib.request; urllib.request.urlopen('{router_url(spec)}/health', timeout=5)"
    return ContainerSpec(
        name=name, purpose="vllm-router (prefill/decode)", image=image, vllm_args=None,
        command=router_args(spec), entrypoint=["python3", "-m", "vllm_router.launch_router"],
        env={"PYTHONPATH": ROUTER_MOUNT, "PYTHONDONTWRITEBYTECODE": "1"}, secret_env={"OPENAI_API_KEY": "api_key"},
        network_mode="host", ipc_mode="private", privileged=False, gpus=None, ulimits={}, shm_size_mb=None,
        volumes=[VolumeSpec(host=wheel_dir, container=ROUTER_MOUNT, read_only=True)], devices=[], capabilities=[],
        restart="unless-stopped",
        labels={f"{LABEL_PREFIX}.role": "router", f"{LABEL_PREFIX}.stack": stack,
                f"{LABEL_PREFIX}.router-version": ROUTER_VERSION, **spec.extra_labels},
        healthcheck=HealthcheckSpec(test=["CMD", "python3", "-c", health], interval_s=10, timeout_s=6, retries=3,
                                    start_period_s=min(spec.worker_startup_timeout_s, 3600)))


def check_pd_argv(spec: RouterSpec, served_name: str, program: Sequence[str] = ("python3", "-m", "checks.pd"),
                  api_key_env: str = "VLLM_API_KEY", thinking_kwarg: str | None = None) -> list[str]:
    """checks/pd.py's command line for the same instances and router; `thinking_kwarg`: the model's key that turns
    reasoning off (stacks/planner/model_cards.py `thinking_request`), given when it is not the check's default."""
    thinking = ["--thinking-kwarg", thinking_kwarg] if thinking_kwarg not in (None, "thinking") else []
    return [*program, "--router-url", router_url(spec), "--router-metrics-url", router_metrics_url(spec),
            "--prefill-urls", ",".join(u.rstrip("/") for u in spec.prefill_urls),
            "--decode-urls", ",".join(u.rstrip("/") for u in spec.decode_urls),
            "--served-name", served_name, "--api-key-env", api_key_env, *thinking]



def router_summary(spec: RouterSpec) -> dict[str, object]:
    """The router as the plan shows it."""
    return {"version": ROUTER_VERSION, "wheel_sha256": ROUTER_WHEEL_SHA256, "url": router_url(spec),
            "metrics_url": router_metrics_url(spec), "prefill": list(spec.prefill_urls),
            "decode": list(spec.decode_urls), "policy": spec.policy, "argv": router_argv(spec)}


def wheel_install_script(url: str, dest: str = ROUTER_HOST_DIR) -> str:
    """A POSIX shell script for the head: fetch the wheel from `url` (python3's urllib: https, http or file), refuse
    it unless its sha256 is the pinned one, unpack it beside `dest` and swap it in. Idempotent: a `dest` holding the
    pinned digest's marker is kept as it is. The wheel's own RECORD is not needed: the digest covers every byte."""
    marker = f"{dest}/.vllm-cluster-sha256"
    fetch = ("import shutil, sys, urllib.request\n"
             "with urllib.request.urlopen(sys.argv[1], timeout=600) as r, open(sys.argv[2], 'wb') as f:\n"
             "    shutil.copyfileobj(r, f)\n")
    q = shlex.quote
    return "\n".join([
        "set -eu",
        f"if [ -f {q(marker)} ] && [ \"$(cat {q(marker)})\" = {ROUTER_WHEEL_SHA256} ]; then",
        f"  echo {q(f'vllm-router {ROUTER_VERSION}: already unpacked in {dest}')}; exit 0",
        "fi",
        "work=$(mktemp -d)",
        "trap 'rm -rf \"$work\"' EXIT",
        f"printf %b {q(fetch)} > \"$work/fetch.py\"",
        f"url={q(url)}",
        "python3 \"$work/fetch.py\" \"$url\" \"$work/router.whl\"",
        "got=$(sha256sum \"$work/router.whl\" | cut -d' ' -f1)",
        f"if [ \"$got\" != {ROUTER_WHEEL_SHA256} ]; then",
        f"  echo \"vllm-router wheel from $url: sha256 $got, expected {ROUTER_WHEEL_SHA256} (vllm-router "
        f"{ROUTER_VERSION} as PyPI serves it): not unpacked. Fetch the identical file, or fix "
        "disaggregation.router.wheel_url\" >&2",
        "  exit 1",
        "fi",
        "python3 -m zipfile -e \"$work/router.whl\" \"$work/unpacked\"",
        "chmod -R a+rX \"$work/unpacked\"  # zip keeps no modes: every user reads the libraries",
        f"mkdir -p {q(dest.rsplit('/', 1)[0])}",
        f"rm -rf {q(dest + '.new')}",
        f"mv \"$work/unpacked\" {q(dest + '.new')}",
        f"echo {ROUTER_WHEEL_SHA256} > {q(dest + '.new/.vllm-cluster-sha256')}",
        f"rm -rf {q(dest)}",
        f"mv {q(dest + '.new')} {q(dest)}",
        f"echo {q(f'vllm-router {ROUTER_VERSION}: unpacked into {dest}')}",
    ])


def wheel_remove_script(dest: str = ROUTER_HOST_DIR) -> str:
    """The `pulumi destroy` side of wheel_install_script: the unpacked wheel leaves the head, unless a container
    still mounts it (a replaced `router-wheel`, whose new one keeps the same pinned files under the same path while
    the router runs from them: only the last one out removes them)."""
    q = shlex.quote
    return "\n".join([
        "set -eu",
        f"if [ -n \"$(docker ps -aq --filter volume={q(dest)})\" ]; then",
        f"  echo {q(f'vllm-router {ROUTER_VERSION}: {dest} kept, a container still mounts it')}; exit 0",
        "fi",
        f"rm -rf {q(dest)} {q(dest + '.new')}",
        f"echo {q(f'vllm-router {ROUTER_VERSION}: {dest} removed')}",
    ])

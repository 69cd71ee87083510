"""`restart-group --yes` and `supervise` as a user runs them (`python -m stacks …`), against real Docker engines.

Each node of the prod stack (2 nodes, DP 2, start order node2 -> node1) is a Docker engine of its own, started by
the tests (tests/docker_harness.py `private_dockerd`: it accepts `--gpus all` as a GPU node's engine does). On
each runs the node's engine container as the plan states it (image reference, command, environment, labels,
mounts, GPUs, network, IPC, shm size, capabilities, restart policy, health check; not `--privileged` or the ulimits,
which this machine cannot grant a running container: the node map's `ungranted` tells `drift` so), so `drift`
finds nothing and the commands act. The image is a small
one tagged as the plan's image: the head answers the OpenAI API (checks/standin.py, through
tests/heal_engine.py) on loopback, a headless rank idles. The node map (`VLLM_CLUSTER_NODE_MAP`, a test seam)
points each node at its engine.

Everything asserted is observable: containers' start times from `docker inspect`, the engines' own start log,
the API's answers and the commands' output lines. Every wait is on a condition with a generous deadline.
"""

from __future__ import annotations

import http.server
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from heal.node_access import NODE_MAP_ENV
from heal.watch_unit import watch_argv
from stacks.model.loader import load_stack
from stacks.planner.container_spec import ContainerSpec
from stacks.planner.plan import Plan, build_plan
from stacks.planner.topology import dp_rank_nodes
from tests.conftest import ROOT
from tests.docker_harness import build_image, docker_ready, parse_started_at, private_dockerd
from tests.nginx_harness import free_port
from tests.test_observability import query
from tests.waiting import wait_for as harness_wait_for

STACK = "prod"
DEADLINE_S = 300
"""Generous: the machine is shared; a restart of these small engines takes seconds."""
ENGINE = ROOT / "tests" / "heal_engine.py"
STANDIN = ROOT / "checks" / "standin.py"


def plan_for(overrides: list[str]) -> Plan:
    return build_plan(STACK, load_stack(STACK, overrides))


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """node -> the `unix://` address of that node's own Docker engine, the plan's image imported in each."""
    why = docker_ready()
    if why:
        pytest.fail(f"a Docker engine is needed ({why}); `make services` starts dockerd")
    plan = plan_for([])
    image = plan.nodes[0].containers[0].image
    with ExitStack() as stack:
        hosts = {}
        for node in plan.start_order:
            work = tmp_path_factory.mktemp(f"engine-{node}")
            hosts[node] = stack.enter_context(private_dockerd(work))
            build_image(image, work, with_vllm=False, files={ENGINE: "/heal_engine.py", STANDIN: "/standin.py"},
                        changes=('ENTRYPOINT ["python3", "/heal_engine.py"]',), docker_host=hosts[node])
        yield hosts


def docker(host: str, *args: str, check: bool = True) -> str:
    done = subprocess.run(["docker", "-H", host, *args], capture_output=True, text=True, timeout=180)
    if check and done.returncode != 0:
        raise AssertionError(f"docker {shlex.join(args[:4])}: {done.stderr.strip()}")
    return done.stdout


def create_args(spec: ContainerSpec, name: str) -> list[str]:
    """`docker create` for a planned container, as the program creates it (minus --privileged and the ulimits)."""
    args = ["create", "--name", name, "--network", spec.network_mode, "--ipc", spec.ipc_mode, "--restart",
            spec.restart]
    if spec.gpus:
        args += ["--gpus", spec.gpus]
    if spec.shm_size_mb:
        args += ["--shm-size", f"{spec.shm_size_mb}m"]
    for cap in spec.capabilities:
        args += ["--cap-add", cap]
    for device in spec.devices:
        args += ["--device", f"{device}:{device}"]
    for key, value in spec.env.items():
        args += ["-e", f"{key}={value}"]
    for key, value in spec.labels.items():
        args += ["--label", f"{key}={value}"]
    for volume in spec.volumes:
        args += ["-v", f"{volume.host}:{volume.container}{':ro' if volume.read_only else ''}"]
    if spec.healthcheck is not None:
        check = spec.healthcheck
        args += ["--health-cmd", shlex.join(check.test[1:]), "--health-interval", f"{check.interval_s}s",
                 "--health-timeout", f"{check.timeout_s}s", "--health-retries", str(check.retries),
                 "--health-start-period", f"{check.start_period_s}s"]
    assert spec.entrypoint is None and not spec.secret_env, "the image's entrypoint runs the plan's command"
    return [*args, spec.image, *spec.command]


def started_at(host: str, name: str) -> datetime:
    return parse_started_at(docker(host, "inspect", "-f", "{{.State.StartedAt}}", name))


wait_for = partial(harness_wait_for, deadline_s=DEADLINE_S)


def answer(port: int) -> str | None:
    """The head's answer to the golden prompt, or None while it does not answer."""
    body = json.dumps({"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "user", "content": "17*19?"}]})
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return str(json.loads(response.read())["choices"][0]["message"]["content"])
    except OSError:
        return None


@dataclass
class Group:
    plan: Plan
    overrides: list[str]
    hosts: dict[str, str]
    names: dict[str, str]
    port: int
    work: Path
    env: dict[str, str] = field(default_factory=dict)

    def starts(self) -> list[str]:
        """Engine starts in order, as node names (from each start's VLLM_HOST_IP)."""
        node_of = {spec.env["VLLM_HOST_IP"]: node.name for node in self.plan.nodes for spec in node.containers}
        # each container's /root/.cache is its own keyed directory under the cache dir (stacks/planner/launch.py
        # cache_key): every start's line, from all of them, in the order of their times
        lines = [line.split() for path in (self.work / "cache").glob("*/starts")
                 for line in path.read_text().splitlines()]
        return [node_of[ip] for ip, *when in sorted(lines, key=lambda parts: float(parts[1]))]

    def started(self) -> dict[str, datetime]:
        return {node: started_at(self.hosts[node], name) for node, name in self.names.items()}

    def control(self, faults: dict[str, int]) -> None:
        path = self.work / "models" / "control.json"
        path.with_suffix(".tmp").write_text(json.dumps(faults))
        path.with_suffix(".tmp").replace(path)

    def command(self, *args: str) -> list[str]:
        sets = [word for value in self.overrides for word in ("--set", value)]
        return [sys.executable, "-m", "stacks", *args, STACK, *sets]


@pytest.fixture
def group(engines: dict[str, str], tmp_path: Path) -> Iterator[Group]:
    port = free_port()
    for sub in ("models", "cache", *(f"shm-{n}" for n in engines)):
        (tmp_path / sub).mkdir()
    overrides = ["serving.host=127.0.0.1", f"serving.port={port}", f"model.host_dir={tmp_path / 'models'}",
                 f"container.cache_dir={tmp_path / 'cache'}", "container.restart=no"]
    plan = plan_for(overrides)
    tag = uuid.uuid4().hex[:8]
    names = {node.name: f"heal-e2e-{tag}-{node.name}" for node in plan.nodes}
    made = Group(plan, overrides, engines, names, port, tmp_path)
    made.control({})
    made.env = {NODE_MAP_ENV: json.dumps({node: {"docker_host": engines[node], "container": names[node],
                                                 "shm_dir": str(tmp_path / f"shm-{node}"),
                                                 "ungranted": "privileged,ulimits"} for node in names})}
    try:
        for node in plan.nodes:
            docker(engines[node.name], *create_args(node.containers[0], names[node.name]))
        for node in plan.start_order:  # as Pulumi starts them
            docker(engines[node], "start", names[node])
        wait_for(lambda: answer(port) == "323", "the group answers")
        yield made
    finally:
        for node, name in names.items():
            docker(engines[node], "rm", "-f", name, check=False)


class Lines:
    """A process's output lines, read as they come (the supervisor's log goes to stdout)."""

    def __init__(self, argv: list[str], env: dict[str, str], path: Path) -> None:
        self.lines: list[str] = []
        self.file = open(path, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self.file.write(line)
            self.file.flush()

    def seen(self, text: str) -> list[str]:
        return [line for line in list(self.lines) if text in line]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.file.close()


def actions(lines: list[str], action: str) -> list[str]:
    """The node of each `<action>:` log line, in order."""
    return [line.split(f" {action}: ")[1].split()[0] for line in lines if f" {action}: " in line]


def test_restart_group_yes_restarts_a_healthy_group_in_start_order(group: Group) -> None:
    order = list(group.plan.start_order)
    assert order == ["node2", "node1"], "the head starts last in this stack"
    stale = [group.work / f"shm-{node}" / "psm_0badc0de" for node in order]
    for path in stale:
        path.write_text("left by a crashed engine")
    before = group.started()
    began = time.monotonic()
    done = subprocess.run(group.command("restart-group", "--yes", "--lock", str(group.work / "deploy.lock")),
                          cwd=ROOT, env={**os.environ, **group.env}, capture_output=True, text=True, timeout=900)
    print(f"\nrestart-group --yes: {time.monotonic() - began:.1f}s")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert f"restart-group {STACK}: PASS" in lines[-1]
    assert actions(lines, "stop") == order[::-1] and actions(lines, "start") == order
    assert any(" check: golden check exit 0" in line for line in lines)
    after = group.started()
    assert all(after[node] > before[node] for node in order), (before, after)
    assert after["node2"] < after["node1"], "node2 started before the head, as the plan orders"
    assert group.starts() == order + order, "each rank started once more, in order, none alone"
    assert all(not path.exists() for path in stale), "stale shared memory removed"
    assert answer(group.port) == "323"


def test_supervise_brings_a_killed_rank_back_with_the_whole_group(group: Group) -> None:
    order = list(group.plan.start_order)
    supervisor = Lines(group.command("supervise", "--interval-s", "1", "--hang-s", "20", "--backoff-first-s", "1",
                                     "--backoff-max-s", "4", "--lock", str(group.work / "deploy.lock"),
                                     "--metrics-file", str(group.work / "group.prom"), "--golden-metrics-url", ""),
                       group.env, group.work / "supervisor.log")
    try:
        wait_for(lambda: supervisor.seen(" start: watching"), "the supervisor's first line")
        before = group.started()
        killed = time.monotonic()
        docker(group.hosts["node2"], "kill", group.names["node2"])
        wait_for(lambda: supervisor.seen(" healed: ") or supervisor.proc.poll() is not None, "the group healed")
        print(f"\nsupervise: rank killed -> group healed (golden check passed) in {time.monotonic() - killed:.1f}s")
    finally:
        supervisor.stop()
    lines = supervisor.lines
    assert supervisor.seen(" healed: "), "\n".join(lines)
    death = supervisor.seen(" death: ")
    assert len(death) == 1 and f"rank node2 container {group.names['node2']} exited (exit code 137" in death[0]
    assert actions(lines, "stop") == order[::-1] and actions(lines, "start")[-2:] == order
    assert supervisor.seen(" check: golden check exit 0")
    after = group.started()
    assert all(after[node] > before[node] for node in order) and after["node2"] < after["node1"]
    assert group.starts() == order + order, "the head was restarted too, after node2: never a lone rank"
    assert answer(group.port) == "323"
    assert f'vllm_cluster_group_restarts_total{{stack="{STACK}"}} 1' in (group.work / "group.prom").read_text()


def test_supervise_treats_a_rank_failing_the_watch_units_golden_set_as_dead(group: Group) -> None:
    """Every container runs and /health answers 200, but DP rank 1 fails every golden prompt (HTTP 500, as a
    dead engine behind a live API server): only the watch unit's per-rank result shows it."""
    dp_size, rank_nodes = dp_rank_nodes([(n.name, n.dp_ranks) for n in group.plan.nodes])
    watch_port = free_port()
    watch = Lines(watch_argv(python=sys.executable, url=f"http://127.0.0.1:{group.port}",
                             served_name="DeepSeek-V4.1-Flash", dp_size=dp_size, rank_nodes=rank_nodes,
                             interval_s=1, timeout_s=10, metrics_listen=f"127.0.0.1:{watch_port}"),
                  {}, group.work / "watch.log")
    supervisor = Lines(group.command("supervise", "--interval-s", "1", "--hang-s", "8", "--backoff-first-s", "1",
                                     "--backoff-max-s", "4", "--lock", str(group.work / "deploy.lock"),
                                     "--golden-metrics-url", f"http://127.0.0.1:{watch_port}/metrics",
                                     "--golden-max-age-s", "60"),
                       group.env, group.work / "supervisor.log")
    try:
        wait_for(lambda: watch.seen(" FIRST "), "the watch's first round")
        wait_for(lambda: supervisor.seen(" start: watching"), "the supervisor's first line")
        before = group.started()
        failing = time.monotonic()
        group.control({"down_rank": 1})
        wait_for(lambda: supervisor.seen(" death: "), "the failing rank treated as dead")
        dead = time.monotonic()
        # the cause stays until the supervisor has looked again and begun the restart: cleared earlier, its fresh
        # look before restarting finds every rank answering and (rightly) restarts nothing ("recovered")
        wait_for(lambda: supervisor.seen(" restart: ") or supervisor.proc.poll() is not None, "the restart begun")
        group.control({})  # the cause is gone: the restarted group answers
        wait_for(lambda: supervisor.seen(" healed: ") or supervisor.proc.poll() is not None, "the group healed")
        print(f"\nsupervise: rank 1 failing -> death {dead - failing:.1f}s (hang 8 s), healed "
              f"{time.monotonic() - failing:.1f}s")
    finally:
        supervisor.stop()
        watch.stop()
    assert supervisor.seen(" healed: "), "\n".join(supervisor.lines)
    assert "golden results http://127.0.0.1:" in supervisor.seen(" start: watching")[0]
    degraded = supervisor.seen(" degraded: ")[0]
    assert "watch unit: DP rank 1 on node2 failed its golden set" in degraded and "GET " not in degraded
    death = supervisor.seen(" death: ")[0]
    assert "no progress for" in death and "watch unit: DP rank 1 on node2" in death
    assert float(death.split("no progress for ")[1].split("s")[0]) >= 8
    assert watch.seen("DOWN") and "node2" in watch.seen("DOWN")[0]
    after = group.started()
    assert all(after[node] > before[node] for node in group.plan.start_order)
    assert group.starts()[-2:] == list(group.plan.start_order)
    assert answer(group.port) == "323"


class Webhook(http.server.BaseHTTPRequestHandler):
    received: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        Webhook.received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_supervise_ends_a_crash_loop_with_an_alert(group: Group) -> None:
    """node2 dies a second after every start: back-off between restarts, then give-up, the webhook and the metric,
    and the process exits 3 (the unit does not restart it)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Webhook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Webhook.received = []
    node2_ip = group.plan.node("node2").containers[0].env["VLLM_HOST_IP"]
    group.control({"crash": node2_ip})
    env = {**group.env, "VLLM_CLUSTER_ALERT_WEBHOOK": f"http://127.0.0.1:{server.server_address[1]}/hook"}
    supervisor = Lines(group.command("supervise", "--interval-s", "1", "--hang-s", "20", "--backoff-first-s", "1",
                                     "--backoff-max-s", "60", "--max-per-hour", "3", "--lock",
                                     str(group.work / "deploy.lock"), "--metrics-file", str(group.work / "group.prom"),
                                     "--golden-metrics-url", ""),
                       env, group.work / "supervisor.log")
    try:
        wait_for(lambda: supervisor.seen(" start: watching"), "the supervisor's first line")
        docker(group.hosts["node2"], "kill", group.names["node2"])
        code = wait_for(lambda: supervisor.proc.poll() is not None and supervisor.proc.returncode, "the give-up")
    finally:
        supervisor.stop()
        server.shutdown()
    lines = "\n".join(supervisor.lines)
    assert code == 3, lines
    assert len(supervisor.seen(" restart: ")) == 3, lines
    delays = [float(line.split("next restart in ")[1].split("s")[0]) for line in supervisor.seen(" backoff: ")]
    assert delays == sorted(delays) and len(delays) >= 2 and delays[-1] > delays[0], delays
    assert "3 restarts in the last hour (limit 3)" in supervisor.seen(" give-up: ")[0]
    assert supervisor.seen(" alert: webhook 127.0.0.1:")
    assert len(Webhook.received) == 1 and Webhook.received[0]["event"] == "group-supervisor-gave-up"
    assert f'vllm_cluster_group_gave_up{{stack="{STACK}"}} 1' in (group.work / "group.prom").read_text()
    starts = group.starts()
    assert starts[:2] == ["node2", "node1"] and starts.count("node1") == starts.count("node2"), \
        "the whole group each time, never node2 alone"


PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def scrape(port: int) -> dict[str, float]:
    """The supervisor's own /metrics over HTTP, by series name ({} while it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    except OSError:
        return {}
    return {line.split("{")[0]: float(line.split()[-1]) for line in text.splitlines() if not line.startswith("#")}


def firing(prom_port: int, promql: str) -> list[dict[str, Any]]:
    try:
        return list(query(prom_port, promql)["data"]["result"])
    except OSError:
        return []


def test_supervise_serves_its_give_up_to_the_planned_prometheus(group: Group) -> None:
    """The real `supervise` with `--metrics-listen` (the flag the unit renders with observability on), driven to
    give up by a crash loop. Over HTTP its gave-up gauge goes 0 -> 1 and the process stays up, restarting nothing;
    a real Prometheus with the stack's generated scrape job and rules (`python -m stacks observability`, the
    supervisor's target moved to loopback) fires VllmClusterGroupGaveUp; stopped, its target is down and
    VllmClusterSupervisorDown is pending."""
    metrics_port, prom_port = free_port(), free_port()
    obs = group.work / "obs"
    made = subprocess.run(group.command("observability", "--out", str(obs), "--set", "observability.enabled=true",
                                        "--assume-secret", "grafana_admin_password"),
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert made.returncode == 0, made.stderr
    prom = yaml.safe_load((obs / "prometheus.yml").read_text())
    prom["global"]["scrape_interval"] = prom["global"]["evaluation_interval"] = "1s"
    job = next(j for j in prom["scrape_configs"] if j["job_name"] == "supervisor")
    assert job["static_configs"][0]["targets"] == ["10.30.8.1:9465"], "the plan's address: the monitoring node's"
    job["static_configs"][0]["targets"] = [f"127.0.0.1:{metrics_port}"]
    prom["scrape_configs"] = [job]
    (obs / "prometheus.yml").write_text(yaml.safe_dump(prom))
    node2_ip = group.plan.node("node2").containers[0].env["VLLM_HOST_IP"]
    group.control({"crash": node2_ip})
    supervisor = Lines(group.command("supervise", "--interval-s", "1", "--hang-s", "20", "--backoff-first-s", "1",
                                     "--backoff-max-s", "60", "--max-per-hour", "2", "--lock",
                                     str(group.work / "deploy.lock"), "--golden-metrics-url", "",
                                     "--metrics-listen", f"127.0.0.1:{metrics_port}"),
                       group.env, group.work / "supervisor.log")
    prometheus = subprocess.Popen([PROMETHEUS, f"--config.file={obs / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={group.work / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{prom_port}"],
                                  cwd=obs, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: supervisor.seen(" start: watching"), "the supervisor's first line")
        assert f"metrics on http://127.0.0.1:{metrics_port}/metrics" in supervisor.seen(" start: watching")[0]
        assert scrape(metrics_port)["vllm_cluster_group_gave_up"] == 0
        wait_for(lambda: firing(prom_port, f'vllm_cluster_group_gave_up{{stack="{STACK}"}} == 0'),
                 "Prometheus reading gave_up 0")
        assert not firing(prom_port, 'ALERTS{alertname="VllmClusterGroupGaveUp"}'), "silent while it heals"
        docker(group.hosts["node2"], "kill", group.names["node2"])
        served = wait_for(lambda: (m := scrape(metrics_port)).get("vllm_cluster_group_gave_up") == 1 and m,
                          "gave_up 1 over HTTP")
        assert served["vllm_cluster_group_restarts_total"] == 2 and served["vllm_cluster_group_restarts_last_hour"] == 2
        alert = wait_for(lambda: firing(prom_port, 'ALERTS{alertname="VllmClusterGroupGaveUp",alertstate="firing"}'),
                         "the gave-up alert firing in Prometheus")
        assert alert[0]["metric"]["severity"] == "critical" and alert[0]["metric"]["stack"] == STACK
        assert supervisor.proc.poll() is None, "served, a give-up keeps the supervisor up"
        assert len(supervisor.seen(" restart: ")) == 2 and "staying up to serve" in supervisor.seen(" give-up: ")[0]
        supervisor.stop()  # systemctl stop: a dead supervisor is a failed scrape, never a stale 1 or 0
        wait_for(lambda: firing(prom_port, f'up{{job="supervisor",stack="{STACK}"}} == 0'), "its target down")
        wait_for(lambda: firing(prom_port, 'ALERTS{alertname="VllmClusterSupervisorDown"}'),
                 "the supervisor-down alert pending (it fires after 2 minutes)")
        assert not firing(prom_port, 'ALERTS{alertname="VllmClusterTargetDown"}'), "one alert for it, not two"
    finally:
        supervisor.stop()
        prometheus.kill()
        prometheus.wait()
    starts = group.starts()
    assert starts.count("node1") == starts.count("node2"), "the whole group each time, never node2 alone"

"""The group supervisor against real containers: a 2- and a 3-node group as containers of the local Docker engine.

Each "rank" is tests/group_rank.py in an imported image; it appends its node name to a shared start log when it
starts, serves /health and /golden, and obeys control files (hang, crash). Nodes map to containers through the
test seam of heal/node_access.py. The supervisor runs in a thread with short intervals; every wait is on a
condition (a log line, a container state) with a generous deadline.
"""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import pytest

from checks.api import serve_metrics
from heal.group import Group, Rank
from heal.node_access import MappedAccess
from heal.supervisor import GAVE_UP, DeployLock, Log, Settings, Supervisor
from tests.conftest import ROOT
from tests.docker_harness import build_image, docker_ready, parse_started_at, remove_image
from tests.waiting import wait_for as harness_wait_for

RANK = ROOT / "tests" / "group_rank.py"
DEADLINE_S = 240
"""Generous: the machine is shared; a healthy restart of these stand-ins takes seconds."""


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    why = docker_ready()
    if why:
        pytest.fail(why)
    tag = f"heal-rank-{uuid.uuid4().hex[:8]}:1"
    build_image(tag, tmp_path_factory.mktemp("img"), with_vllm=False, files={RANK: "/rank.py"})
    yield tag
    remove_image(tag)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def docker(*args: str, check: bool = True) -> str:
    return subprocess.run(["docker", *args], check=check, capture_output=True, text=True, timeout=120).stdout


@dataclass
class Cluster:
    group: Group
    access: MappedAccess
    log_dir: Path
    ctl: Path
    names: list[str]

    def starts(self) -> list[str]:
        path = self.log_dir / "starts"
        return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []

    def start_order(self) -> list[str]:
        """Nodes in the order Docker last started their containers (State.StartedAt): the order the supervisor
        controls. A rank's own start line can come later than the next rank's on a loaded machine (its interpreter
        is slower to reach it), so the start log counts starts and this gives their order."""
        def started(name: str) -> datetime:
            return parse_started_at(docker("inspect", "-f", "{{.State.StartedAt}}", name))
        return [node for _, node in sorted((started(name), node) for name, node in zip(
            self.names, [r.node for r in self.group.ranks], strict=True))]

    def running(self, name: str) -> bool:
        return docker("inspect", "-f", "{{.State.Running}}", name).strip() == "true"


@pytest.fixture
def cluster(image: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    nodes = [f"node{i}" for i in range(1, int(getattr(request, "param", 2)) + 1)]
    tag = uuid.uuid4().hex[:8]
    log_dir, ctl = tmp_path / "log", tmp_path / "ctl"
    log_dir.mkdir()
    ctl.mkdir()
    port = free_port()
    ranks, names, mapping = [], [], {}
    for i, node in enumerate(nodes):
        name = f"heal-{tag}-{node}"
        shm = tmp_path / f"shm-{node}"
        shm.mkdir()
        publish = ["-p", f"127.0.0.1:{port}:8000"] if i == 0 else []
        docker("create", "--name", name, "--restart", "no", "--stop-timeout", "5", "-e", f"RANK_NODE={node}",
               "-v", f"{log_dir}:/log", "-v", f"{ctl}:/ctl", "-v", f"{shm}:/dev/shm", *publish, image,
               "python3", "/rank.py")
        names.append(name)
        ranks.append(Rank(node=node, container=name, ports=(port,) if i == 0 else (), shm_dir=str(shm)))
        mapping[node] = {"docker_host": "unix:///var/run/docker.sock", "container": name}
    golden = (sys.executable, "-c", "import sys,urllib.request; sys.exit(0 if urllib.request.urlopen("
              f"'http://127.0.0.1:{port}/golden', timeout=10).read() == b'323' else 1)")
    group = Group(stack=f"t{tag}", ranks=tuple(ranks), ready_timeout_s=120,
                  health_url=f"http://127.0.0.1:{port}/health", golden_argv=golden)
    made = Cluster(group, MappedAccess(mapping), log_dir, ctl, names)
    for i, name in enumerate(names):  # as Pulumi starts them: in order, each after the one before it
        docker("start", name)
        wait_for(lambda count=i + 1: len(made.starts()) == count, f"{nodes[i]} started")
    try:
        yield made
    finally:
        for name in names:
            docker("rm", "-f", name, check=False)


wait_for = partial(harness_wait_for, deadline_s=DEADLINE_S)


class Running:
    """The supervisor in a thread; `stop()` ends its loop at the next round."""

    def __init__(self, cluster: Cluster, tmp_path: Path, **settings: Any) -> None:
        self.out = open(tmp_path / "supervisor.log", "w")  # noqa: SIM115 (closed in stop)
        self.log = Log(self.out, cluster.group.stack)
        # hang_s 60 and a 30 s probe: only the hang test (hang_s=3, its /health answers 503 at once) may see a hang;
        # with 3 s and 5 s, two probes a loaded machine answered slowly would have been a death and a restart
        values: dict[str, Any] = dict(interval_s=0.5, hang_s=60, backoff_first_s=1, backoff_max_s=4, max_per_hour=4,
                                      health_timeout_s=30, metrics_file=tmp_path / "group.prom")
        values.update(settings)
        self.settings = Settings(**values)
        self.lock = DeployLock(tmp_path / "deploy.lock")
        self.supervisor = Supervisor(cluster.group, cluster.access, self.log, self.settings, self.lock)
        self.code: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        wait_for(lambda: self.seen("start:"), "the supervisor's first line")

    def _run(self) -> None:
        self.code = self.supervisor.run()

    def seen(self, text: str) -> list[str]:
        return [line for line in list(self.log.lines) if text in line]

    def stop(self) -> None:
        self.supervisor.stopped = True
        self.thread.join(timeout=DEADLINE_S)
        self.out.close()


@pytest.mark.parametrize("cluster", [2, 3], indirect=True)
def test_a_killed_rank_brings_the_whole_group_back_in_start_order(cluster: Cluster, tmp_path: Path) -> None:
    nodes = [r.node for r in cluster.group.ranks]
    stale = [Path(r.shm_dir) / "psm_0badc0de" for r in cluster.group.ranks]
    for path in stale:
        path.write_text("left by a crashed engine")
    running = Running(cluster, tmp_path)
    try:
        killed = time.monotonic()
        docker("kill", cluster.names[-1])
        wait_for(lambda: running.seen("healed:"), "the group healed")
        took = time.monotonic() - killed
    finally:
        running.stop()
    print(f"\n{len(nodes)}-node group: killed -> healed (golden check passed) in {took:.1f}s")
    assert sorted(cluster.starts()) == sorted(nodes + nodes), "every rank started again, none alone"
    assert cluster.start_order() == nodes, "restarted in start order, the head first"
    stops = [line.split("stop: ")[1].split()[0] for line in running.seen(" stop: ")]
    assert stops == nodes[::-1]
    assert [line.split("start: ")[1].split()[0] for line in running.seen(" start: ")[1:]] == nodes
    assert all(not p.exists() for p in stale), "stale shared memory removed"
    assert running.seen("removed from") and running.seen("golden check exit 0")
    assert running.seen("death:")[0].endswith(f"container {cluster.names[-1]} exited (exit code 137, no error)")
    assert all(cluster.running(name) for name in cluster.names)
    assert 'vllm_cluster_group_restarts_total{stack="' + cluster.group.stack + '"} 1' in \
        (tmp_path / "group.prom").read_text()


class Webhook(http.server.BaseHTTPRequestHandler):
    received: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Webhook.received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_crash_loop_backs_off_then_gives_up_and_alerts(cluster: Cluster, tmp_path: Path) -> None:
    server = http.server.HTTPServer(("127.0.0.1", 0), Webhook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Webhook.received = []
    (cluster.ctl / "crash-node2").write_text("")
    running = Running(cluster, tmp_path, max_per_hour=3,
                      webhook=f"http://127.0.0.1:{server.server_address[1]}/hook")
    try:
        docker("kill", cluster.names[1])
        wait_for(lambda: running.code is not None, "the supervisor gave up")
    finally:
        running.stop()
        server.shutdown()
    assert running.code == GAVE_UP
    assert len(running.seen(" restart: ")) == 3
    delays = [float(line.split("next restart in ")[1].split("s")[0]) for line in running.seen("backoff:")]
    assert delays and delays == sorted(delays) and delays[-1] > delays[0], delays
    assert running.seen("give-up:") and "3 restarts in the last hour" in running.seen("give-up:")[0]
    assert len(Webhook.received) == 1 and Webhook.received[0]["stack"] == cluster.group.stack
    assert 'vllm_cluster_group_gave_up{stack="' + cluster.group.stack + '"} 1' in (tmp_path / "group.prom").read_text()


def scrape(url: str) -> dict[str, float]:
    """The supervisor's samples by name over HTTP ({} while it does not answer)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    except OSError:
        return {}
    return {line.split("{")[0]: float(line.split()[-1]) for line in text.splitlines() if not line.startswith("#")}


def test_a_served_supervisor_reports_the_back_off_and_the_give_up_over_http(cluster: Cluster, tmp_path: Path) -> None:
    """With a metrics listener (as the unit runs it with observability on) the give-up keeps the supervisor up,
    restarting nothing, so a scrape reads gave_up 1 instead of a refused connection."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    (cluster.ctl / "crash-node2").write_text("")
    running = Running(cluster, tmp_path, max_per_hour=3, backoff_first_s=3, backoff_max_s=6, metrics_url=url)
    server = serve_metrics(("127.0.0.1", port), running.supervisor, thread="supervisor-metrics")
    idle: list[float] = []

    def sleep(seconds: float) -> None:  # counts the loop's rounds after the give-up: it is still running
        if running.supervisor.gave_up:
            idle.append(seconds)
        time.sleep(seconds)

    running.supervisor.sleep = sleep
    try:
        before = wait_for(lambda: scrape(url), "the first scrape")
        assert before["vllm_cluster_group_gave_up"] == 0 and before["vllm_cluster_group_restarts_total"] == 0
        docker("kill", cluster.names[1])
        waiting = wait_for(lambda: (m := scrape(url)).get("vllm_cluster_group_next_restart_in_seconds", 0) > 0 and m,
                           "a scrape during a back-off")
        assert 0 < waiting["vllm_cluster_group_next_restart_in_seconds"] <= 6
        # a back-off follows a restart (it may have served a moment before the rank crashed again)
        assert waiting["vllm_cluster_group_last_restart_success"] in (0, 1)
        assert waiting["vllm_cluster_group_gave_up"] == 0
        after = wait_for(lambda: (m := scrape(url)).get("vllm_cluster_group_gave_up") == 1 and m, "gave_up 1")
        assert running.seen("give-up:") and f"staying up to serve vllm_cluster_group_gave_up 1 on {url}" in \
            running.seen("give-up:")[0]
        assert after["vllm_cluster_group_restarts_total"] == 3 == after["vllm_cluster_group_restarts_last_hour"]
        assert after["vllm_cluster_group_max_restarts_per_hour"] == 3
        assert after["vllm_cluster_group_last_restart_timestamp_seconds"] > time.time() - DEADLINE_S
        # still up, still served and restarting nothing, round after round, until a person stops it
        wait_for(lambda: len(idle) >= 3 and scrape(url).get("vllm_cluster_group_gave_up") == 1,
                 "three rounds after the give-up, still served")
        assert running.code is None and running.thread.is_alive() and len(running.seen(" restart: ")) == 3
    finally:
        running.stop()
        server.shutdown()
        server.server_close()
    assert running.code == GAVE_UP
    assert scrape(url) == {}, "a stopped supervisor serves nothing: its scrape fails, `up` becomes 0"


def test_a_held_deploy_lock_makes_the_supervisor_wait(cluster: Cluster, tmp_path: Path) -> None:
    deploy = DeployLock(tmp_path / "deploy.lock")
    assert deploy.try_acquire()
    running = Running(cluster, tmp_path)
    try:
        docker("kill", cluster.names[0])
        wait_for(lambda: running.seen("is held"), "the supervisor waiting on the lock")
        assert not running.seen(" restart: ") and not cluster.running(cluster.names[0])
        assert cluster.starts() == ["node1", "node2"]
        deploy.release()
        wait_for(lambda: running.seen("healed:"), "the group healed after the lock was released")
    finally:
        deploy.release()
        running.stop()
    assert sorted(cluster.starts()) == ["node1", "node1", "node2", "node2"]
    assert cluster.start_order() == ["node1", "node2"]


@pytest.mark.parametrize("cluster", [3], indirect=True)
def test_a_hang_is_a_death_after_the_stated_time(cluster: Cluster, tmp_path: Path) -> None:
    running = Running(cluster, tmp_path, hang_s=3)
    try:  # seen serving first: before that, failing health alone is no death (this host may not reach it)
        wait_for(lambda: running.seen("healthy:"), "the group seen serving")
        (cluster.ctl / "hang").write_text("")
        wait_for(lambda: running.seen("death:"), "the hang treated as a death")
        # the hang stays until the restart has begun: ended earlier, the supervisor's fresh look before restarting
        # finds the group serving and (rightly) restarts nothing
        wait_for(lambda: running.seen(" restart: "), "the restart begun")
        (cluster.ctl / "hang").unlink()
        wait_for(lambda: running.seen("healed:"), "the group healed")
    finally:
        running.stop()
    lines = running.log.lines
    degraded = next(i for i, line in enumerate(lines) if "degraded:" in line)
    death = next(i for i, line in enumerate(lines) if "death:" in line)
    assert degraded < death and not any(" stop: " in line for line in lines[:death]), "alive until the stated time"
    assert "HTTP 503" in lines[degraded] and "HTTP 503" in lines[death]
    assert float(lines[death].split("no progress for ")[1].split("s")[0]) >= 3
    assert sorted(cluster.starts()) == sorted(["node1", "node2", "node3"] * 2)
    assert cluster.start_order() == ["node1", "node2", "node3"]


def test_the_supervisor_refuses_to_restart_into_drift(cluster: Cluster, tmp_path: Path) -> None:
    """A restart policy changed by hand (`docker update`) on a rank: the supervisor says why and restarts nothing."""
    from heal.drift import compare_container
    from stacks.planner.container_spec import ContainerSpec

    planned = ContainerSpec(name=cluster.names[1], purpose="", image="", vllm_args=None, command=[], entrypoint=None,
                            env={}, secret_env={}, network_mode="bridge", ipc_mode="private", privileged=False,
                            gpus=None, ulimits={}, shm_size_mb=None, volumes=[], devices=[], capabilities=[],
                            restart="no", labels={}, healthcheck=None)

    def drift_check() -> list[str]:
        found = json.loads(docker("inspect", cluster.names[1]))[0]
        return [f"{r.node} {r.kind}: plan {r.plan}, found {r.found}"
                for r in compare_container("node2", planned, found, None, None) if r.kind == "restart-policy"]

    docker("update", "--restart", "on-failure", cluster.names[1])
    running = Running(cluster, tmp_path)
    running.supervisor.drift_check = drift_check
    try:
        docker("kill", cluster.names[0])
        wait_for(lambda: running.code is not None, "the supervisor refused")
    finally:
        running.stop()
    assert running.code == GAVE_UP and not running.seen(" restart: ")
    assert "refusing to restart into a drifted state: node2 restart-policy: plan no, found on-failure" in \
        running.seen("give-up:")[0]
